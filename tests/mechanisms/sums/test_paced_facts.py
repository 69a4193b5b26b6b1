"""The facts of the factorization counters' steps (noise std, worst loss, epsilon_spent) are computed a
chunk ahead in small paced units (issue 26.4): no step pays for a whole chunk, and the values are those
of a chunk computed at once (a fresh worker, a jump)."""

from __future__ import annotations

import pickle

import pytest

import beam_dp.core.calibration as calibration
from beam_dp.core import NoiseSource
from beam_dp.mechanisms.sums import factorization
from tests.mechanisms.sums.helpers import KEY, build

STEPS = 1100  # past four 256-step chunk boundaries


@pytest.fixture(params=["toeplitz", "blt"])
def counter(request):
    return request.param


def facts(mech, t):
    std, loss = mech._step_facts(t)
    return std, loss.gaussian_mu_sq, mech.spend(loss)[0]


def test_paced_facts_equal_facts_computed_at_once(counter):
    paced = build(counter, "gaussian", horizon=2 * STEPS)
    stepped = [facts(paced, t) for t in range(1, STEPS + 1)]
    for t in (1, 255, 256, 300, 511, 512, 767, 768, 1024, STEPS):  # each a miss on a fresh instance: at once
        at_once = facts(build(counter, "gaussian", horizon=2 * STEPS), t)
        # the same arithmetic on the same inputs in the same order (only its pacing differs): equal up to
        # the last bit; 1e-14 relative leaves room for nothing else (the bisection's own tolerance is 1e-12)
        assert stepped[t - 1] == pytest.approx(at_once, rel=1e-14, abs=0)


def test_no_step_computes_a_whole_chunk(counter, monkeypatch):
    """Work per step, counted: closed forms (``noise_var``) and analytic-Gaussian evaluations (``log_ndtr``,
    two per vectorised ``delta_A``). A chunk computed at once costs 256 closed forms and ~90 evaluations."""
    mech = build(counter, "gaussian", horizon=2 * STEPS)
    calls = {"noise_var": 0, "log_ndtr": 0}
    log_ndtr, noise_var = calibration.log_ndtr, mech.noise_var

    def counted(name, fn):
        def wrapper(*args):
            calls[name] += 1
            return fn(*args)
        return wrapper

    monkeypatch.setattr(calibration, "log_ndtr", counted("log_ndtr", log_ndtr))
    monkeypatch.setattr(mech, "noise_var", counted("noise_var", noise_var))
    noise, state = NoiseSource(KEY), mech.init_state("s")
    worst = {"noise_var": 0, "log_ndtr": 0}
    for t in range(1, STEPS + 1):
        before = dict(calls)
        state, (release,) = mech.step(state, None, noise)
        if t > 256:  # from the first 256-step chunk on, every chunk was paced during the one before it
            for name in calls:
                worst[name] = max(worst[name], calls[name] - before[name])
    # a step calls _step_facts twice (loss, meta): at most two units of work
    assert worst["noise_var"] <= 2 * factorization._FACTS_PER_UNIT
    assert worst["log_ndtr"] <= 2 * 2
    assert worst["noise_var"] > 0 and worst["log_ndtr"] > 0  # the pacing did run


def test_a_mechanism_with_paced_work_pickles_and_resumes_with_the_same_releases(counter):
    mech, noise = build(counter, "gaussian", horizon=2 * STEPS, dim=2), NoiseSource(KEY)
    state = mech.init_state("s")
    for _ in range(300):  # mid-chunk: the next chunk's facts are half computed
        state, _ = mech.step(state, None, noise)
    assert mech.__dict__["_facts_ahead"]
    copy = pickle.loads(pickle.dumps(mech))  # a fresh worker: the paced jobs are worker-local, not pickled
    state_copy = state
    for _ in range(500):
        state, (a,) = mech.step(state, None, noise)
        state_copy, (b,) = copy.step(state_copy, None, noise)
        # same noise cells and facts, computed paced (mech) or at the first miss (copy): equal up to the
        # last bit (1e-12 relative: the Toeplitz span FFT and the bisection may differ only in rounding)
        assert a.value == pytest.approx(b.value, rel=1e-12, abs=1e-12)
        assert a.epsilon_spent == pytest.approx(b.epsilon_spent, rel=1e-12, abs=0)
        assert a.meta["noise_std"] == pytest.approx(b.meta["noise_std"], rel=1e-12, abs=0)
