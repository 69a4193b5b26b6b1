"""The Flink adapter's per-key step logic without Flink: same releases as the pure mechanism, late
data and bad rows dead-lettered, count steps, declared streams. Runs in the main venv and in .venv-flink."""

from __future__ import annotations

import json

import pytest

from beam_dp.flink.params import FlinkReleaseParams
from beam_dp.flink.steps import KeyedSteps
from tests.flink.cases import BAD, BUILD, CLOCK, STREAMS, assert_rows_equal, expected_rows, good_events


def _drive(steps: KeyedSteps, events, final_ms: int):
    """A minimal engine: per-key state and one timer per key, watermark at ``final_ms`` at the end."""
    states, timers, outputs = {}, {}, []
    for stream in STREAMS:
        states[stream], _, timers[stream] = steps.on_element(None, (stream, None, None))
    for element in events:
        key = element[0] if isinstance(element[0], str) else ""
        states[key], out, timer = steps.on_element(states.get(key), element)
        outputs += out
        if timer is not None:
            timers[key] = timer
    for key in list(timers):
        while timers.get(key) is not None and timers[key] <= final_ms:
            states[key], out, timers[key] = steps.on_timer(states[key], timers[key])
            outputs += out
    return outputs


def _split(outputs):
    rows = [json.loads(j) for kind, j in outputs if kind == "release"]
    dead = [json.loads(j) for kind, j in outputs if kind == "dead_letter"]
    return rows, dead


def test_releases_equal_the_pure_mechanism_and_bad_rows_are_dead_letters():
    events = good_events()
    params = FlinkReleaseParams(BUILD, clock=CLOCK, streams=STREAMS)
    steps = KeyedSteps(params)
    rows, dead = _split(_drive(steps, events + [e for e, _ in BAD], 2**62))
    assert_rows_equal(rows, expected_rows(events, params.domain))
    assert sorted(d["reason"] for d in dead) == sorted(r for _, r in BAD)
    assert all("nan" not in d["detail"] and "text" not in d["detail"] for d in dead)  # value-free details


def test_late_data_after_a_step_closed_is_dead_lettered_and_never_enters_state():
    steps = KeyedSteps(FlinkReleaseParams(BUILD, clock=CLOCK, streams=("a",)))
    state, _, timer = steps.on_element(None, ("a", None, None))
    assert timer == CLOCK.step_end_micros(1) // 1000 - 1
    state, _, _ = steps.on_element(state, ("a", 1001.0, [0.5, 0.5]))
    state, out, timer = steps.on_timer(state, timer)  # watermark passed step 1
    assert [json.loads(j)["step"] for _, j in out] == [1] and state.next_step == 2
    before = state.mechanism_state
    state, out, _ = steps.on_element(state, ("a", 1005.0, [0.9, 0.9]))  # step 1 again: late
    assert [json.loads(j)["reason"] for _, j in out] == ["late"] and state.pending == []
    assert state.mechanism_state == before


def test_count_steps_release_every_block_size_contributions():
    params = FlinkReleaseParams(BUILD, block_size=3, domain="job/Counts")  # an explicit domain
    steps = KeyedSteps(params)
    state, outputs = None, []
    for i in range(7):
        state, out, timer = steps.on_element(state, ("a", None, [0.1 * i, 0.0]))
        assert timer is None
        outputs += out
    rows, _ = _split(outputs)
    assert [r["step"] for r in rows] == [1, 2]
    mechanism = BUILD()
    from beam_dp.core import NoiseSource
    from tests.conftest import TEST_KEY

    mech_state = mechanism.init_state("a")
    mech_state, (r1,) = mechanism.step(mech_state, [[0.0, 0.0], [0.1, 0.0], [0.2, 0.0]],
                                     NoiseSource(TEST_KEY).for_domain("job/Counts"))
    assert rows[0]["value"] == pytest.approx(r1.value.tolist(), rel=1e-12)


def test_invalid_parameters_fail_before_a_job_is_built():
    with pytest.raises(ValueError):
        FlinkReleaseParams(BUILD)  # no schedule
    with pytest.raises(ValueError):
        FlinkReleaseParams(BUILD, clock=type(CLOCK)(start=0.0, period=0.0005))  # sub-millisecond steps
