"""Noise is bound to the privacy parameters: two runs under one key and one domain but other parameters
draw independent noise (else ``(Y - r X) / (1 - r)`` recovers the exact sums); an identical run
reproduces its releases exactly; a state resumed under other parameters is refused.

Independence is checked by the sample correlation of n = 1,000 paired noise draws of the two runs (one
value per stream and coordinate at step 1: different streams are independent cells, and the coordinates
of one K-norm or Gaussian draw are uncorrelated). For uncorrelated pairs the sample correlation has mean
0 and standard deviation 1/sqrt(n) (to first order, exactly here since the pairs are uncorrelated and
have finite fourth moments), so |r| < 4/sqrt(n) = 0.126 fails by chance with probability ~6e-5; the
unbound derivation gives |r| = 1 exactly (the noise is a public multiple of the same draws).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from beam_dp.beam import ContinualSumParams, NoiseKey
from beam_dp.core import NoiseSource, StepClock
from beam_dp.core.noise_binding import EXCLUDED_FIELDS, calibration_binding, calibration_fingerprint
from beam_dp.mechanisms.replay import replay_event_time
from beam_dp.steps.coder import KeyState, UnreadableState, decode_key_state, encode_key_state
from beam_dp.steps.params import noise_source_of
from tests.conftest import TEST_KEY

N_PAIRS = 1000
BOUND = 4 / np.sqrt(N_PAIRS)
CLOCK = StepClock(start=0.0, period=1.0, end=2.0)
STREAMS = tuple(f"s{i}" for i in range(N_PAIRS // 2))  # 500 streams x 2 coordinates = 1,000 pairs


def _step_one_noise(params) -> np.ndarray:
    """Step-1 releases of every stream on zero data (= the noise), drawn with the source a worker loads."""
    noise = noise_source_of(params, lambda *_: NoiseSource(TEST_KEY))
    mechanism = params.build_mechanism()
    ids = np.array(STREAMS)
    by_stream = replay_event_time(mechanism, ids, np.full(len(ids), 0.5), np.zeros((len(ids), 2)), CLOCK, noise,
                                  STREAMS)
    return np.concatenate([np.asarray(rels[0].value, dtype=float) for rels in by_stream.values()])


def _params(**kw):
    return ContinualSumParams(clock=CLOCK, dim=2, counter="tree", noise_key=NoiseKey(domain="job/ContinualSum"), **kw)


CASES = {
    "gamma epsilon 1 vs 2": (dict(noise="gamma", epsilon=1.0), dict(noise="gamma", epsilon=2.0)),
    "gaussian epsilon 1 vs 2": (dict(noise="gaussian", epsilon=1.0, delta=1e-6),
                                dict(noise="gaussian", epsilon=2.0, delta=1e-6)),
    "gaussian clip bound 1 vs 2": (dict(noise="gaussian", delta=1e-6, clip_bound=1.0),
                                   dict(noise="gaussian", delta=1e-6, clip_bound=2.0)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_changed_parameter_draws_independent_noise(case):
    a, b = (_step_one_noise(_params(**kw)) for kw in CASES[case])
    assert a.shape == b.shape == (N_PAIRS,)
    assert abs(np.corrcoef(a, b)[0, 1]) < BOUND
    np.testing.assert_array_equal(_step_one_noise(_params(**CASES[case][0])), a)  # an identical run: the same


def test_the_unbound_derivation_is_the_leak_this_guards():
    """With the legacy derivation (the domain alone) the two calibrations' noise is one draw, scaled."""
    noises = []
    for kw in CASES["gamma epsilon 1 vs 2"]:
        params = _params(**kw)
        noise = NoiseSource(TEST_KEY).for_domain("job/ContinualSum")
        by_stream = replay_event_time(params.build_mechanism(), np.array(STREAMS), np.full(len(STREAMS), 0.5),
                                      np.zeros((len(STREAMS), 2)), CLOCK, noise, STREAMS)
        noises.append(np.concatenate([np.asarray(r[0].value, dtype=float) for r in by_stream.values()]))
    assert abs(np.corrcoef(*noises)[0, 1]) > 1 - 1e-9


def test_fingerprint_covers_every_field_but_the_documented_exclusions():
    base = _params(noise="gaussian", delta=1e-6)
    assert calibration_binding(base) == calibration_binding(_params(noise="gaussian", delta=1e-6))  # stable
    assert calibration_binding(base).startswith("b1:")
    flip = {"paper": "analytic", "analytic": "paper"}
    changed = dict(epsilon=1.5, delta=1e-7, clip_bound=0.5, noise="gamma", calibration=flip[base.calibration],
                   horizon=2, unbounded="doubling", granularity=0.25, allowed_lateness=1.0, streams=("s0",), dim=3)
    for name, value in changed.items():
        kw = {"delta": 0.0} if name == "noise" else {}
        assert calibration_binding(dataclasses.replace(base, **{name: value}, **kw)) != calibration_binding(base), name
    # excluded: the key's location (and domain, bound separately), encoded states, engine grouping
    moved = dataclasses.replace(base, noise_key=NoiseKey(key_file="/elsewhere", domain="other"), stream_groups=4)
    assert calibration_binding(moved) == calibration_binding(base)
    assert {"noise_key", "restore_states", "stream_groups"} <= EXCLUDED_FIELDS
    fields = json.loads(calibration_fingerprint(base))["fields"]
    assert "epsilon" in fields and "noise_key" not in fields


def test_budget_share_and_factories_are_bound():
    from beam_dp.core.budget import JobBudget

    one = JobBudget(1.0).split({"sum": "pure"})["sum"]
    two = JobBudget(1.0).split({"sum": "pure", "count": "pure"})["sum"]
    assert calibration_binding(_params(**one.params())) != calibration_binding(_params(**two.params()))
    # a factory: its bound arguments and the constants of a lambda are bound
    import functools

    from beam_dp.flink.params import FlinkReleaseParams
    from beam_dp.mechanisms.sums.tree import make_tree_sum

    def flink(build):
        return calibration_binding(FlinkReleaseParams(build=build, clock=StepClock(0.0, 1.0, 4.0)))

    kw = dict(horizon=None, unbounded="hybrid", dim=1, delta=0.0, clip_bound=1.0, noise="gamma", calibration="paper")
    one, two = (functools.partial(make_tree_sum, epsilon=e, **kw) for e in (1.0, 2.0))
    assert flink(one) != flink(two)
    assert flink(one) == flink(functools.partial(make_tree_sum, epsilon=1.0, **kw))
    assert flink(lambda: make_tree_sum(epsilon=1.0, **kw)) != flink(lambda: make_tree_sum(epsilon=2.0, **kw))


def test_for_domain_rejects_a_bad_binding_and_keeps_domains_apart():
    root = NoiseSource(TEST_KEY)
    with pytest.raises(ValueError, match="binding"):
        root.for_domain("d", "")
    draw = lambda s: s.gaussian("s", "p", (1,), 1.0, 4)  # noqa: E731
    assert not np.array_equal(draw(root.for_domain("d", "b1:x")), draw(root.for_domain("d", "b1:y")))
    assert not np.array_equal(draw(root.for_domain("d", "b1:x")), draw(root.for_domain("e", "b1:x")))
    assert not np.array_equal(draw(root.for_domain("d", "b1:x")), draw(root.for_domain("d")))  # legacy: independent
    np.testing.assert_array_equal(draw(root.for_domain("d", "b1:x")), draw(root.for_domain("d", "b1:x")))


def test_a_key_state_under_other_parameters_is_refused_and_a_legacy_one_is_read():
    binding = calibration_binding(_params())
    state = KeyState("s", np.zeros(3, dtype=np.uint8), 4, noise_binding=binding)
    assert decode_key_state(encode_key_state(state), binding).next_step == 4
    with pytest.raises(UnreadableState, match="other privacy parameters"):
        decode_key_state(encode_key_state(state), calibration_binding(_params(epsilon=2.0)))
    legacy = encode_key_state(dataclasses.replace(state, noise_binding=None))
    assert decode_key_state(legacy, binding).noise_binding is None  # read: the driver continues it as legacy
    ended = dataclasses.replace(state, noise_binding=None, ended=True, stream_ended=True)
    assert decode_key_state(encode_key_state(ended), binding).stream_ended  # draws nothing more: read as is


@pytest.mark.pipeline
def test_continual_stats_with_count_added_draws_new_sum_noise(tmp_path, monkeypatch):
    """``--count`` halves the sum's budget share (1 -> 0.5): under one key and one label the sum's noise
    is independent of the run without it; the run without it, repeated, reproduces its rows exactly."""
    from beam_dp.io import read_releases
    from pipelines import continual_stats

    monkeypatch.setenv("BEAM_DP_NOISE_KEY", TEST_KEY.hex())
    lines = ["stream_id,timestamp,value_0,value_1"] + [f"{s},0.5,0.0,0.0" for s in STREAMS]
    (tmp_path / "e.csv").write_text("\n".join(lines) + "\n")

    def sums(name: str, *extra: str) -> dict:
        out = tmp_path / name
        argv = ["--input", str(tmp_path / "e.csv"), "--output", str(out), "--start", "0", "--period", "1", "--end",
                "2", "--counter", "tree", "--format", "jsonl", *extra]
        assert continual_stats.main(argv) == 0
        rows = read_releases(str(out / "sum-*"))
        return {r["stream"]: np.asarray(r["value"], dtype=float) for r in rows if r["step"] == 1}

    alone, with_count, again = sums("alone"), sums("count", "--count"), sums("again")
    a = np.concatenate([alone[s] for s in STREAMS])
    b = np.concatenate([with_count[s] for s in STREAMS])
    assert a.shape == b.shape == (N_PAIRS,)
    assert abs(np.corrcoef(a, b)[0, 1]) < BOUND
    assert all(np.array_equal(alone[s], again[s]) for s in STREAMS)


def test_the_fingerprint_is_canonical_and_refuses_what_it_cannot_write():
    from beam_dp.core.noise_binding import _canon

    assert _canon({"b": 1.5, "a": (1, np.float64(2.0))}, 0) == _canon({"a": [1, 2.0], "b": 1.5}, 0)
    assert _canon(np.array([1.0, 2.0]), 0) != _canon(np.array([1.0, 2.5]), 0)
    assert _canon(np.array(["x", None], dtype=object), 0) == _canon(np.array(["x", None], dtype=object), 0)
    assert _canon(frozenset({"x", "y"}), 0) == _canon(frozenset({"y", "x"}), 0)
    with pytest.raises(TypeError, match="deterministically"):
        _canon(object(), 0)
    with pytest.raises(TypeError, match="params dataclass"):
        calibration_fingerprint({"epsilon": 1.0})


def test_numbers_are_bound_by_value():
    assert calibration_binding(_params(epsilon=1)) == calibration_binding(_params(epsilon=1.0))
    assert calibration_binding(ContinualSumParams(clock=StepClock(0, 1, 2))) == calibration_binding(
        ContinualSumParams(clock=StepClock(0.0, 1.0, 2.0)))
