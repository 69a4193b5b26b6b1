"""Issue 25.7: dead letters a user can act on — the element as JSON values as read, the stream when
known, the source row, one validation of an event's head (one set of reasons and messages) for every
family."""

from __future__ import annotations

import datetime as dt
import inspect
import json

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp

from beam_dp.beam import ContinualSumParams, GrowingDatabaseParams, IncrementalRegressionParams
from beam_dp.beam.growing_db import ParseGrowing
from beam_dp.beam.online import ParseRecords
from beam_dp.beam.shell.parse import ParseEvents
from beam_dp.core import StepClock
from beam_dp.mechanisms.growing_db.universe import Categorical, Universe
from beam_dp.mechanisms.online.convex_sets import L2Ball
from beam_dp.steps.events import DETAIL, DeadLetter, EventBatch, Reason, json_value


def test_a_dead_letter_round_trips_as_json_with_values_as_read():
    """bytes become their text, numpy values numbers/lists, NaN its text (JSON has no NaN), a datetime
    ISO text, a Beam row and an EventBatch objects; json.loads(json.dumps(x)) == x exactly (these are
    exact JSON values, no float arithmetic). Mutant checked: the old ``repr(element)`` fails."""
    element = {"stream_id": b"a", "timestamp": np.float64(12.5), "value": np.array([1.0, np.nan]),
               "when": dt.datetime(2026, 1, 2, 3, 4, 5), "row": beam.Row(x=np.int64(3), y=(1, "b")),
               "bad": b"\xff\xfe", "inf": float("-inf"), "n": None, "ok": True}
    letter = DeadLetter(Reason.NON_FINITE, DETAIL[Reason.NON_FINITE], "a", element, "/data/e.csv#record=7")
    out = letter.to_json("parse")
    text = json.dumps(out, allow_nan=False)
    assert json.loads(text) == out
    assert out["element"] == {"stream_id": "a", "timestamp": 12.5, "value": [1.0, "nan"],
                              "when": "2026-01-02T03:04:05", "row": {"x": 3, "y": [1, "b"]},
                              "bad": "\\xff\\xfe", "inf": "-inf", "n": None, "ok": True}
    assert out["stream"] == "a" and out["source"] == "/data/e.csv#record=7" and out["stage"] == "parse"
    batch = EventBatch(np.array(["s", "t"], dtype=object), np.array([1.0, 2.0]), np.ones((2, 1)))
    assert json_value(batch) == {"stream_id": ["s", "t"], "timestamp": [1.0, 2.0], "value": [[1.0], [1.0]]}


CLOCK = StepClock(100.0, 10.0, end=200.0)
STREAMS = ("a", "b")


def _sum_parser():
    return ParseEvents(ContinualSumParams(dim=1, clip_bound=1.0, epsilon=1.0, clock=CLOCK, streams=STREAMS), False)


def _growing_parser():
    params = GrowingDatabaseParams(universe=Universe([Categorical("c", ("x", "y"))]), n=1, epsilon=1.0, clock=CLOCK,
                                   streams=STREAMS)
    return ParseGrowing(params, "element")


def _regression_parser():
    return ParseRecords(IncrementalRegressionParams(dim=1, constraint=L2Ball(1), epsilon=1.0, delta=1e-6, clock=CLOCK,
                                                    streams=STREAMS))


# (family parser, a valid payload after (stream_id, timestamp))
FAMILIES = {"sum": (_sum_parser, (0.5,)), "growing": (_growing_parser, ("x",)),
            "regression": (_regression_parser, ([0.5], 0.2))}
BAD_HEADS = [  # (stream_id, timestamp) -> reason
    ((b"a", 110.0), Reason.BAD_STREAM_ID), (("", 110.0), Reason.BAD_STREAM_ID), (("z", 110.0), Reason.UNDECLARED_STREAM),
    (("a", "soon"), Reason.BAD_TIMESTAMP), (("a", float("nan")), Reason.BAD_TIMESTAMP),
    (("a", 2e12), Reason.OUT_OF_RANGE), (("a", 50.0), Reason.BEFORE_START), (("a", 250.0), Reason.AFTER_END),
]


def _letters(parser, element) -> list[DeadLetter]:
    """The dead letters of a bundle of one element (a parser that builds blocks writes some at the bundle's end)."""
    parser.setup()
    parser.start_bundle()
    context = {"timestamp": Timestamp(0), "window": GlobalWindow()}  # what Beam passes a process that asks
    asks = inspect.signature(parser.process).parameters
    outs = list(parser.process(element, **{k: v for k, v in context.items() if k in asks}))
    outs += list(parser.finish_bundle() or ())
    return [getattr(out.value, "windows", None) and out.value.value or out.value
            for out in outs if isinstance(out, beam.pvalue.TaggedOutput)]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_dead_letters_a_bad_head_with_the_same_reason_and_message(family):
    """One validation path (beam_dp.steps.events.split_event): the same bad (stream_id, timestamp)
    gives the same reason and detail in every family, the stream filled in when it is a valid id."""
    make, payload = FAMILIES[family]
    for (stream, ts), reason in BAD_HEADS:
        element = (stream, ts, *payload)
        (letter,) = _letters(make(), element)
        assert (letter.reason, letter.detail) == (reason, DETAIL[reason]), (family, stream, ts)
        known = reason not in (Reason.BAD_STREAM_ID,)
        assert letter.stream == (stream if known else None)
        assert letter.element == element
    assert _letters(make(), ("a", 110.0, *payload)) == []  # the valid element passes
    (letter,) = _letters(make(), ("a", 110.0))
    assert letter.reason == Reason.MALFORMED and letter.detail.startswith("expected (stream_id, timestamp, ")


def test_a_rejected_event_batch_row_names_its_file_and_record():
    batch = EventBatch(np.array(["a", "a", "b"], dtype=object), np.array([110.0, 250.0, 120.0]), np.ones((3, 1)),
                       "/in/e.csv", np.array([1, 3, 4]))
    letters = _letters(_sum_parser(), batch)
    assert [(x.reason, x.stream, x.source) for x in letters] == [(Reason.AFTER_END, "a", "/in/e.csv#record=3")]


def _erm_parser():
    from beam_dp.beam.erm import ContinualModelParams, ParseLabelledExamples

    return ParseLabelledExamples(ContinualModelParams(update=2, base=4, n_features=1, classes=(0, 1), streams=STREAMS))


def _lifelong_parser():
    from beam_dp.beam.lifelong import LifelongParams, ParseTaskRows
    from beam_dp.mechanisms.lifelong.config import L2DPConfig

    config = L2DPConfig(input_dim=1, n_classes=2, hidden=4, g_layers=(4,), batch_size=2, epochs=1, task_ids=("0",),
                        device="cpu", epsilon=1.0)
    return ParseTaskRows(LifelongParams(config, allow_cuda=False, streams=STREAMS))


# count-step families (no timestamp): (parser, the payload after stream_id, the value's field name)
COUNT_FAMILIES = {"erm": (_erm_parser, ([0.5], 1), "features"), "lifelong": (_lifelong_parser, ("0", [0.5], 1), "x")}


@pytest.mark.parametrize("family", list(COUNT_FAMILIES))
def test_the_count_step_families_share_the_head_and_value_checks(family):
    """ERM and lifelong validate through the same path (split_event, coerce_value): the same bad
    stream id, tuple width, element type or value gives the reason and message of every family.
    Mutant checked: lifelong's own tuple check ("or an end marker") fails the malformed detail."""
    make, payload, field = COUNT_FAMILIES[family]
    for stream, reason in ((b"a", Reason.BAD_STREAM_ID), ("", Reason.BAD_STREAM_ID), ("z", Reason.UNDECLARED_STREAM)):
        (letter,) = _letters(make(), (stream, *payload))
        assert (letter.reason, letter.detail) == (reason, DETAIL[reason]), (family, stream)
        assert letter.stream == (None if reason == Reason.BAD_STREAM_ID else stream)
    assert _letters(make(), ("a", *payload)) == []  # the valid element passes
    names = ", ".join(("stream_id", "task_id", "x", "y") if family == "lifelong" else ("stream_id", "features", "label"))
    (letter,) = _letters(make(), ("a", *payload, 9, 9))
    assert (letter.reason, letter.detail) == (Reason.MALFORMED, f"expected ({names}), got a {len(payload) + 3}-tuple")
    (letter,) = _letters(make(), 7)
    assert (letter.reason, letter.detail, letter.stream) == (Reason.MALFORMED, "unsupported element type int", None)
    for value, reason, detail in (("abc", Reason.BAD_VALUE, f"{field} is missing or text"),
                                  ([float("nan")], Reason.NON_FINITE, DETAIL[Reason.NON_FINITE])):
        bad = ("a", *payload[:-2], value, payload[-1])  # the value comes just before the label
        (letter,) = _letters(make(), bad)
        assert (letter.reason, letter.detail, letter.stream) == (reason, detail, "a"), (family, value)
        assert json.loads(json.dumps(letter.to_json("parse"), allow_nan=False))["element"][0] == "a"
