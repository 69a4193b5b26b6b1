"""A small event stream shared by the Flink tests, and its reference releases from the pure mechanism."""

from __future__ import annotations

import functools
import json

import numpy as np

from beam_dp.core import NoiseSource, StepClock
from beam_dp.core.budget import composition_of
from beam_dp.core.noise_binding import calibration_binding
from beam_dp.mechanisms.replay import replay_event_time
from beam_dp.mechanisms.sums.tree import make_tree_sum
from beam_dp.steps.schema import ReleaseLabels, release_to_row
from tests.conftest import TEST_KEY

DOMAIN = "flink-test"  # the release function's uid in these tests: its noise domain
CLOCK = StepClock(start=1000.0, period=10.0, end=1100.0)  # 10 steps
STREAMS = ("a", "b", "silent")
BUILD = functools.partial(make_tree_sum, horizon=None, unbounded="hybrid", dim=2, epsilon=1.0, delta=0.0,
                          clip_bound=1.0, noise="gamma", calibration="paper")


def good_events(n: int = 60, seed: int = 7) -> list[tuple]:
    """In time order (no late data, whatever the watermark interval): ``(stream, seconds, [v0, v1])``."""
    rng = np.random.default_rng(seed)
    ts = np.sort(CLOCK.start + rng.random(n) * (CLOCK.end - CLOCK.start - 25.0))  # steps 8..10 stay empty
    ids = rng.choice(["a", "b"], n)
    values = rng.normal(0, 1, (n, 2))
    return [(str(i), float(t), v.tolist()) for i, t, v in zip(ids, ts, values)]


#: Bad rows, each with the dead-letter reason it must get (interleaved with good events in time order).
BAD = [
    (("a", 1010.5, [float("nan"), 0.0]), "non_finite"),
    (("a", 1011.0, [1.0]), "wrong_shape"),
    (("zz", 1012.0, [0.1, 0.1]), "undeclared_stream"),
    (("b", 1012.5, "text"), "bad_value"),
]


def csv_lines(events: list[tuple]) -> str:
    """Events as the entry point's CSV lines ``stream,seconds,v0,v1`` (``repr``: the floats round-trip; a
    text value as it is)."""
    return "".join(f"{s},{t!r},{v if isinstance(v, str) else ','.join(map(repr, v))}\n" for s, t, v in events)


def entry_args(input_path, output, *extra: str) -> list[str]:
    """``beam_dp.flink.run`` flags of :data:`CLOCK`, :data:`STREAMS` and :data:`BUILD` (counter ``tree``)."""
    return ["--input", str(input_path), "--output", str(output), "--start", str(CLOCK.start), "--period",
            str(CLOCK.period), "--end", str(CLOCK.end), "--dim", "2", "--streams", ",".join(STREAMS),
            "--counter", "tree", *extra]


def entry_params(*extra: str):
    """The params ``beam_dp.flink.run`` builds under :func:`entry_args` (and ``extra`` flags): BUILD's
    hybrid tree at the job's budget share of ``--epsilon`` (``beam_dp.core.budget.flag_budget``)."""
    from beam_dp.flink.run import _args, _params

    return _params(_args(entry_args("in", "out", *extra)))


def entry_binding(*extra: str) -> str:
    """The noise binding of ``beam_dp.flink.run`` under :func:`entry_args` (and ``extra`` flags)."""
    return calibration_binding(entry_params(*extra))


def expected_rows(events: list[tuple], domain: str = DOMAIN, binding: str | None = None) -> list[dict]:
    """The pure replay's rows in ``domain`` under ``binding`` (default: the params' own) of the entry
    point's params for its domain ``continual-sums``, else of ``FlinkReleaseParams(build=BUILD,
    clock=CLOCK, streams=STREAMS)``."""
    from beam_dp.flink.params import FlinkReleaseParams

    params = entry_params() if domain == "continual-sums" else FlinkReleaseParams(build=BUILD, clock=CLOCK,
                                                                                  streams=STREAMS)
    binding = calibration_binding(params) if binding is None else binding
    ids = np.array([e[0] for e in events])
    ts = np.array([e[1] for e in events])
    values = np.array([e[2] for e in events])
    mechanism = params.build_mechanism()
    noise = NoiseSource(TEST_KEY).for_domain(domain, binding)
    by_stream = replay_event_time(mechanism, ids, ts, values, CLOCK, noise, STREAMS)
    labels = ReleaseLabels(domain, composition_of(mechanism), params.budget)
    rows = [labels(release_to_row(r, mechanism.guarantee, CLOCK.step_start_micros(r.step),
                                  CLOCK.step_end_micros(r.step)))
            for releases in by_stream.values() for r in releases]
    return sorted((json.loads(json.dumps(r._asdict())) for r in rows), key=lambda r: (r["stream"], r["step"]))


def assert_rows_equal(got: list[dict], want: list[dict]) -> None:
    got = sorted(got, key=lambda r: (r["stream"], r["step"]))
    assert [(r["stream"], r["step"]) for r in got] == [(r["stream"], r["step"]) for r in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g["value"], w["value"], rtol=1e-9, atol=1e-9)  # summation order differs
        assert {k: v for k, v in g.items() if k != "value"} == {k: v for k, v in w.items() if k != "value"}
