"""Noise domains of Flink release functions (:mod:`beam_dp.flink.domains`): no default domain, a domain
claimed twice in one job refused. Plain Python (no PyFlink): runs in the main venv too. The job-level
checks on a real Flink environment and the noise statistic are in ``test_flink_domains.py``."""

from __future__ import annotations

import functools

import pytest

from beam_dp.core import StepClock
from beam_dp.flink.domains import bind_noise_domain, operator_uid
from beam_dp.flink.params import FlinkReleaseParams
from beam_dp.mechanisms.sums.tree import make_tree_sum
from beam_dp.steps.params import NoiseKey

CLOCK = StepClock(start=0.0, period=10.0, end=100.0)
BUILD = functools.partial(make_tree_sum, horizon=10, dim=1, epsilon=1.0, clip_bound=1.0)


def test_params_carry_no_default_domain_and_a_function_without_uid_or_domain_is_refused():
    params = FlinkReleaseParams(build=BUILD, clock=CLOCK)
    assert params.noise_key.domain is None
    with pytest.raises(ValueError, match="no default domain"):
        bind_noise_domain(params, None, [])
    with pytest.raises(ValueError, match="no noise domain"):  # a function built around the binding cannot draw
        params.noise_key.load()


def test_the_uid_names_the_domain_unless_params_name_one():
    bound, uid = bind_noise_domain(FlinkReleaseParams(build=BUILD, clock=CLOCK), "sums", [])
    assert (bound.noise_key.domain, uid) == ("sums", "beam_dp/sums")
    explicit = FlinkReleaseParams(build=BUILD, clock=CLOCK, noise_key=NoiseKey(domain="pinned"))
    bound, uid = bind_noise_domain(explicit, "sums", [])
    assert (bound.noise_key.domain, uid) == ("pinned", operator_uid("pinned"))


def test_a_domain_claimed_twice_in_one_job_is_refused():
    params = FlinkReleaseParams(build=BUILD, clock=CLOCK)
    claimed = [operator_uid("sums"), "some-other-operator"]
    with pytest.raises(ValueError, match="already claimed"):
        bind_noise_domain(params, "sums", claimed)
    explicit = FlinkReleaseParams(build=BUILD, clock=CLOCK, noise_key=NoiseKey(domain="sums"))
    with pytest.raises(ValueError, match="already claimed"):  # an explicit domain equal to another's uid
        bind_noise_domain(explicit, "count", claimed)
    assert bind_noise_domain(params, "count", claimed)[1] == "beam_dp/count"
    with pytest.raises(ValueError, match="non-empty string"):
        bind_noise_domain(params, "", claimed)
