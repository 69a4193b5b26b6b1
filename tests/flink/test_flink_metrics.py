"""The Flink shell's metrics (the Beam shell's names: releases, dead letters in all and per reason,
buffered items, timer firings, unreadable states, the last closed step and its lag) and its handling
of state this version cannot read: one ``unreadable_state`` dead letter and the metric, the stream
ended, never an exception Flink would retry forever. Scripted Flink (tests/flink/test_shell_rules.py);
that they reach Flink's REST API from a real cluster: tests/flink/test_cluster_metrics.py."""

from __future__ import annotations

import pytest

pytest.importorskip("pyflink")

from tests.flink.test_shell_rules import END, Metrics, ScriptedFlink, _ms, _params  # noqa: E402


class _Recorded(Metrics):
    """The scripted metric group, recording the groups the function adds."""

    def add_group(self, name):
        self.store.setdefault("groups", set()).add(self.prefix + name)
        return _Recorded(f"{self.prefix}{name}.", self.store)


def test_metrics_count_what_the_function_did():
    flink = ScriptedFlink(_params(allowed_lateness=5.0))
    flink.metrics = _Recorded()
    flink.restore()  # the function opened on the recording group
    flink.element("a", 1.0, [0.5])
    flink.element("b", 2.0, [0.5])
    flink.element("a", 12.0, [0.25])
    assert flink.metrics.value("buffered_items") == 3  # (a, 1), (b, 1), (a, 2): one merged entry per key step
    flink.element("a", 13.0, [0.25])  # merged into (a, 2)
    assert flink.metrics.value("buffered_items") == 3
    flink.advance(_ms(16))  # step 1 closes for a and b
    assert flink.metrics.value("buffered_items") == 1 and flink.metrics.value("last_closed_step") == 1
    flink.element("a", 4.0, [9.0])  # late
    flink.element("a", 5.0, "not a number")  # malformed value
    flink.advance(END)
    m = flink.metrics
    assert m.value("releases") == len(flink.releases) > 0
    assert m.value("timer_firings") == flink.firings
    assert m.value("dead_letters") == len(flink.dead) == 2
    for reason in {d["reason"] for d in flink.dead}:
        assert m.value(f"dead_letters_{reason}") == sum(d["reason"] == reason for d in flink.dead)
    assert m.value("buffered_items") == 0 and m.value("unreadable_states") == 0
    assert m.value("last_closed_step") == max(r["step"] for r in flink.releases)
    assert m.value("last_closed_step_lag_ms") > 0  # its release time (1970) trails the wall clock
    # every metric is a gauge (PyFlink drops a counter's updates made in on_timer), in one group whose
    # names are never also groups (Flink refuses a metric and a group of one name in a group)
    assert m.store["counters"] == {} and m.store["groups"] == {"beam_dp"}


@pytest.mark.parametrize("corrupt", ["beam_dp_key_state", "beam_dp_mechanism"])
def test_state_this_version_cannot_read_ends_the_stream_with_one_letter_and_the_metric(corrupt):
    flink = ScriptedFlink(_params())
    flink.element("a", 1.0, [0.5])
    flink.element("b", 1.0, [0.5])
    flink.advance(_ms(11))  # step 1 released for both
    flink.states["a"][corrupt].data = b"\x00not a state"
    flink.element("a", 12.0, [0.5])  # the key state is read here (the mechanism's when a step closes)
    flink.advance(_ms(21))
    flink.element("a", 22.0, [0.5])  # after the end: stream_ended
    flink.advance(END)
    letters = [d for d in flink.dead if d["stream"] == "a"]
    assert [d["reason"] for d in letters][:1] == ["unreadable_state"]
    assert sum(d["reason"] == "unreadable_state" for d in flink.dead) == 1
    assert {d["reason"] for d in letters[1:]} <= {"stream_ended"}
    assert flink.metrics.value("unreadable_states") == 1
    assert max(r["step"] for r in flink.releases if r["stream"] == "a") == 1  # nothing released for a again
    assert max(r["step"] for r in flink.releases if r["stream"] == "b") > 2  # other keys go on
