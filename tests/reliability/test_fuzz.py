"""Fuzzing bad input through every public transform on the FnApiRunner (issue 8, item 2).

Each hypothesis example mixes a list of generated bad elements (malformed rows, NaN/inf, huge values
in wrong shapes, wrong dtypes, missing keys, bad or out-of-schedule timestamps, unknown streams,
tasks and query ids) into a fixed good stream and runs ONE pipeline. Required outcome, checked on
every example:

* the pipeline does not crash;
* every bad element is in the dead-letter output, once, with a machine-readable reason;
* the releases are identical (every field, bit for bit) to the run on the good stream alone;
* no raw bad value (the markers of ``harness``) appears in a release, a dead letter's detail, or a
  log line; every released number is finite.

The number of generated bad elements is counted per transform and printed (``-s``) for
docs/reliability.md. Settings: derandomized (fixed seed), no deadline; ``BEAM_DP_FUZZ_EXAMPLES``
raises the number of examples per transform.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from beam_dp.beam.erm import BAD_LABEL
from beam_dp.beam.growing_db import GrowingReason
from beam_dp.beam.lifelong import TASK_BACKWARDS, UNKNOWN_TASK
from beam_dp.steps.events import Reason
from tests.reliability.harness import contains_marker, release_values_finite, run_pipeline, sorted_releases
from tests.reliability.targets import all_targets

EXAMPLES = int(os.environ.get("BEAM_DP_FUZZ_EXAMPLES", "8"))
KNOWN_REASONS = {v for c in (Reason, GrowingReason) for k, v in vars(c).items() if k.isupper()} | {
    BAD_LABEL, UNKNOWN_TASK, TASK_BACKWARDS}
TARGETS = {t.name: t for t in all_targets()}
CASES: dict[str, int] = {}
_BASELINES: dict[str, list] = {}


def _baseline(target):
    if target.name not in _BASELINES:
        out = run_pipeline(lambda p: target.build(p, list(target.good)))
        assert out.dead == [], [d.reason for d in out.dead]
        assert out.releases, "the good stream must release something"
        _BASELINES[target.name] = sorted_releases(out.releases)
    return _BASELINES[target.name]


def _interleave(good: list, bad: list, seed: int) -> list:
    slots = np.random.default_rng(seed).integers(0, len(good) + 1, len(bad))
    out, j = [], 0
    order = np.argsort(slots, kind="stable")
    for i, g in enumerate(good):
        while j < len(bad) and slots[order[j]] <= i:
            out.append(bad[order[j]])
            j += 1
        out.append(g)
    out.extend(bad[order[k]] for k in range(j, len(bad)))
    return out


def _check(target, bad: list, seed: int) -> None:
    want = _baseline(target)
    out = run_pipeline(lambda p: target.build(p, _interleave(list(target.good), bad, seed)))
    assert len(out.dead) == len(bad), f"{len(out.dead)} dead letters for {len(bad)} bad elements"
    for letter in out.dead:
        assert letter.reason in KNOWN_REASONS and re.fullmatch(r"[a-z_]+", letter.reason), letter.reason
        assert not contains_marker(letter.detail), letter.detail
    got = sorted_releases(out.releases)
    assert got == want, "bad elements changed the releases"
    for row in got:
        assert release_values_finite(row) and not contains_marker(repr(row))
    leaked = [line for line in out.logs if contains_marker(line)]
    assert not leaked, leaked[:3]
    CASES[target.name] = CASES.get(target.name, 0) + len(bad)


@pytest.mark.parametrize("name", list(TARGETS))
def test_bad_elements_are_dead_lettered_and_never_touch_releases(name):
    target = TARGETS[name]

    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
              phases=(Phase.explicit, Phase.generate),  # no shrinking: each example is a pipeline run
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
    @given(bad=st.lists(target.bad, min_size=100, max_size=200), seed=st.integers(0, 2**16))
    def fuzz(bad, seed):
        _check(target, bad, seed)

    fuzz()
    print(f"\nfuzz cases {name}: {CASES.get(name, 0)}")
