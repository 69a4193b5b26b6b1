"""Audit of a whole job: two transforms under one noise key on the same stream, a statistic that
combines their releases, neighbours that change one contribution (replace-one, event level).

Each transform draws in its own noise domain, exactly as the Beam transforms do
(``NoiseSource(key).for_domain(label)``); the MUTANT gives both the same domain (the bug this guards
against: a shared noise that a combination of the releases cancels). The honest job's 95% lower bound
must stay under the job's total (the JobBudget split); the mutant's must exceed it.

Pairs (the job total is epsilon = 1, split equally, pure epsilon; statistics on the step-1 releases,
the least noisy ones that hold the changed contribution):

* sum + count: neighbours change one contribution from +R to -R (the count is unchanged); statistic
  ``sum_1 - R·count_1``;
* two sums with clip bounds 1 and 2: neighbours change one contribution from 1 to 0; statistic
  ``sum1_1/1 - sum2_1/2`` (with a shared noise, both noises are the same unit draw times a scale
  proportional to R, and cancel);
* sum + windowed sum: neighbours +R / -R; statistic ``sum_1 + windowed_1``. The two mechanisms draw
  under different purposes ("kary"/"wtm"), so a shared domain alone does not collide for this pair:
  its mutant is reported, not required to be caught.
"""

from __future__ import annotations

import numpy as np
import pytest

from beam_dp.beam import ContinualCountParams, ContinualSumParams, WindowedSumParams
from beam_dp.core import NoiseSource, StepClock
from beam_dp.core.budget import JobBudget
from beam_dp.testing.audit import epsilon_lower_bound, run_stream, seeded_key

pytestmark = pytest.mark.slow

CLOCK = StepClock(start=0.0, period=1.0, end=4.0)  # 4 public steps
RUNS = 1500
TOTAL = 1.0


def _first(mechanism, blocks, noise: NoiseSource) -> float:
    """The step-1 release (the least noisy one that holds the changed contribution)."""
    return float(np.ravel(run_stream(mechanism, blocks, noise)[0].value)[0])


def _samples(first, second, blocks_d, blocks_dp, statistic, shared: bool):
    """Statistic samples under D and D' (one fresh key per run) for the honest or the mutant job."""
    out = []
    for blocks in (blocks_d, blocks_dp):
        stats = []
        for seed in range(RUNS):
            root = NoiseSource(seeded_key(seed, b"job"))
            noise_a = root.for_domain("job/A")
            noise_b = noise_a if shared else root.for_domain("job/B")
            stats.append(statistic(_first(first, blocks[0], noise_a), _first(second, blocks[1], noise_b)))
        out.append(np.array(stats))
    return out


def _steps(value):
    return [np.array([[value]])]  # step 1 only: later steps cannot add information about it


def _audit(first, second, d, dp, statistic):
    honest = epsilon_lower_bound(*_samples(first, second, d, dp, statistic, shared=False)).epsilon
    mutant = epsilon_lower_bound(*_samples(first, second, d, dp, statistic, shared=True)).epsilon
    return honest, mutant


def test_sum_and_count_under_one_key():
    R = 3.0
    plan = JobBudget(TOTAL).split({"sum": "pure", "count": "pure"})
    total = plan.total_epsilon()
    sum_mech = ContinualSumParams(dim=1, clip_bound=R, clock=CLOCK, **plan["sum"].params()).build_mechanism()
    count_mech = ContinualCountParams(clock=CLOCK, **plan["count"].params()).build_mechanism()
    ones = [np.ones((1, 1))]
    honest, mutant = _audit(sum_mech, count_mech, (_steps(R), ones), (_steps(-R), ones),
                            lambda s, c: s - R * c)
    print(f"sum + count: honest {honest:.3f}, shared-domain mutant {mutant:.3f}, claim {total:.3f}")
    assert honest <= total < mutant


def test_two_sums_with_different_clip_bounds_under_one_key():
    plan = JobBudget(TOTAL).split({"a": "pure", "b": "pure"})
    total = plan.total_epsilon()
    one = ContinualSumParams(dim=1, clip_bound=1.0, clock=CLOCK, **plan["a"].params()).build_mechanism()
    two = ContinualSumParams(dim=1, clip_bound=2.0, clock=CLOCK, **plan["b"].params()).build_mechanism()
    honest, mutant = _audit(one, two, (_steps(1.0), _steps(1.0)), (_steps(0.0), _steps(0.0)),
                            lambda a, b: a / 1.0 - b / 2.0)
    print(f"two sums: honest {honest:.3f}, shared-domain mutant {mutant:.3f}, claim {total:.3f}")
    assert honest <= total < mutant


def test_sum_and_windowed_sum_under_one_key():
    R = 1.0
    plan = JobBudget(TOTAL).split({"sum": "pure", "windowed": "pure"})
    total = plan.total_epsilon()
    sum_mech = ContinualSumParams(dim=1, clip_bound=R, clock=CLOCK, **plan["sum"].params()).build_mechanism()
    windowed = WindowedSumParams(dim=1, clip_bound=R, clock=CLOCK, window=8,
                                 **plan["windowed"].params()).build_mechanism()
    honest, mutant = _audit(sum_mech, windowed, (_steps(R), _steps(R)), (_steps(-R), _steps(-R)),
                            lambda s, w: s + w)
    print(f"sum + windowed: honest {honest:.3f}, shared-domain mutant {mutant:.3f}, claim {total:.3f}")
    assert honest <= total and mutant <= total  # different purposes: no collision even in one domain
