"""The YAML templates' ``tests:`` blocks, derived from the pure mechanisms under the test key.

``tests/templates/test_yaml_templates.py`` checks that every template's block equals what this
module derives (so the YAML expectations are the pure mechanism's releases, not snapshots) and
then runs ``python -m apache_beam.yaml.main --test`` on each template. After a deliberate change
of a mechanism (its noise, meta or name), rewrite the blocks in place with
``BEAM_DP_NOISE_KEY=$(python -c 'print(bytes(range(32)).hex())') python -m tests.templates.yaml_expectations --write``.

Inputs are dyadic numbers, so sums are exact whatever the order Beam adds them in. Count-step
families (ERM, online learning) see rows in mock order: the FnApiRunner keeps the order of a
``Create`` within a key, as the jobs' own pipeline tests rely on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import yaml

from beam_dp.beam import (
    ContinualCountParams,
    ContinualModelParams,
    ContinualSumParams,
    GrowingDatabaseParams,
    IncrementalRegressionParams,
    OnlineLearnerParams,
    WindowedSumParams,
)
from beam_dp.beam.growing_db import replay_growing_database
from beam_dp.core import NoiseSource, StepClock
from beam_dp.core.budget import composition_of
from beam_dp.core.noise_binding import calibration_binding
from beam_dp.io import ReleaseRow, release_to_row
from beam_dp.io.schema import ReleaseLabels
from beam_dp.mechanisms.erm import LabelledRows
from beam_dp.steps.events import json_value
from pipelines.growing_db_queries import parse_universe, to_element, to_query
from pipelines.model_release import to_example
from pipelines.online_learning import to_record
from tests.beam.helpers import expected_rows
from tests.conftest import TEST_KEY

#: Jinja variables the sum templates' tests run with (no file is read or written: sources and sinks are mocked).
TEST_VARIABLES = {"input": "/nonexistent/events.csv", "output": "/nonexistent/out", "start": 0, "period": 10,
                  "end": 40, "dim": 1, "epsilon": 1.0, "clip_bound": 1.0, "window": 2}

#: The mocked CSV rows: a clipped value (1.5 -> 1.0), a missing value, an event after the end.
EVENTS = [
    {"stream_id": "a", "timestamp": 1.0, "value_0": 0.5},
    {"stream_id": "b", "timestamp": 12.0, "value_0": 0.25},
    {"stream_id": "a", "timestamp": 15.5, "value_0": -0.75},
    {"stream_id": "b", "timestamp": 21.0, "value_0": 1.5},
    {"stream_id": "a", "timestamp": 33.0, "value_0": None},
    {"stream_id": "b", "timestamp": 99.0, "value_0": 0.5},
]

SUMS = ("continual_sum", "continual_count", "windowed_sum", "streaming_continual_sum")
TEMPLATES = SUMS + ("model_release", "online_learner", "incremental_regression", "growing_db_queries")

_FILES = {"input": "/nonexistent/rows.csv", "output": "/nonexistent/out"}
#: Jinja variables of the family templates' tests.
FAMILY_VARIABLES = {
    "model_release": dict(_FILES, dim=2, classes=["a", "b", "c"], epsilon=1.0, clip_bound=1.0, update_size=2,
                          base_size=4, lam=1.0),
    "online_learner": dict(_FILES, dim=2, epsilon=1.0, window=4, loss="logistic", constraint="l2_ball", radius=1.0),
    "incremental_regression": dict(_FILES, dim=2, epsilon=1.0, delta=1e-6, start=0, period=10, end=40),
    "growing_db_queries": dict(_FILES, queries="/nonexistent/queries.csv", n=4, epsilon=1.0, start=0, period=10,
                               end=40, universe={"colour": ["red", "green", "blue"], "size": {"edges": [0, 5, 10]}}),
}


def variables(template: str) -> dict:
    """The Jinja variables ``template``'s test runs with."""
    return TEST_VARIABLES if template in SUMS else FAMILY_VARIABLES[template]


def _row(stream, x0, x1, label, **extra) -> dict:
    return {"stream_id": stream, **extra, "x_0": x0, "x_1": x1, "label": label}


#: ERM: 9 valid examples of s1 (4 blocks of 2 and a partial one), 4 of s2, a label outside the
#: classes, a missing feature, a missing stream id.
EXAMPLES = [
    _row("s1", 0.5, 0.25, "a"), _row("s2", -0.5, 0.5, "b"), _row("s1", -0.25, 0.75, "b"),
    _row("s1", 0.125, -0.5, "c"), _row("s1", 0.75, 0.0, "a"), _row("s2", 0.25, 0.25, "c"),
    _row("s1", 0.5, 0.5, "z"), _row("s1", -0.5, -0.25, "b"), _row("s2", 0.0, -0.75, "a"),
    _row("s1", 0.25, -0.125, "c"), _row("s1", None, 0.5, "a"), _row("s1", -0.75, 0.25, "a"),
    _row("s2", 0.5, -0.5, "b"), _row("s1", 0.375, 0.5, "b"), _row(None, 0.5, 0.5, "a"), _row("s1", 0.5, 0.5, "c"),
]

#: Online learning: logistic labels -1/+1; a label 0.5 and a missing feature (both bad_value).
ONLINE_ROWS = [
    _row("a", 0.5, 0.25, 1.0), _row("b", -0.25, 0.5, -1.0), _row("a", -0.5, 0.5, -1.0), _row("a", 0.25, 0.25, 0.5),
    _row("a", 0.125, -0.75, 1.0), _row("b", 0.5, 0.5, 1.0), _row("a", None, 0.5, 1.0), _row("a", -0.25, -0.5, -1.0),
    _row("b", 0.0, -0.25, -1.0), _row("a", 0.75, 0.0, 1.0),
]

#: Incremental regression: event-time steps of 10 s (step 3 of b empty); an event after the end.
REGRESSION_ROWS = [
    _row("a", 0.5, 0.25, 0.5, timestamp=1.0), _row("b", -0.25, 0.5, -0.25, timestamp=2.0),
    _row("a", -0.5, 0.5, 0.25, timestamp=4.5), _row("a", 0.25, -0.25, 0.75, timestamp=12.0),
    _row("b", 0.5, 0.0, 0.5, timestamp=15.0), _row("a", 0.125, 0.5, -0.5, timestamp=25.0),
    _row("a", 0.5, 0.5, 0.0, timestamp=33.0), _row("b", -0.5, -0.5, 1.0, timestamp=38.0),
    _row("a", 0.25, 0.25, 0.25, timestamp=99.0),
]

#: Growing database: universe colour x size (N = 6), n = 4; an element outside the universe, one
#: after the end; queries by predicate (JSON text) and by cells, one before n and one never reached.
_ELEMENTS = [("a", 1.0, "red", 1.0), ("a", 3.0, "green", 7.0), ("b", 4.0, "blue", 2.0), ("a", 6.0, "red", 3.0),
             ("a", 8.0, "purple", 1.0), ("b", 9.0, "red", 8.0), ("a", 12.0, "blue", 9.0), ("b", 14.0, "green", 1.0),
             ("a", 15.0, "red", 2.0), ("b", 18.0, "blue", 6.0), ("a", 22.0, "green", 4.0), ("a", 27.0, "red", 6.0),
             ("b", 31.0, "red", 3.0), ("a", 35.0, "blue", 1.0), ("a", 99.0, "red", 1.0)]
DB_ELEMENTS = [{"stream_id": s, "timestamp": ts, "colour": c, "size": z} for s, ts, c, z in _ELEMENTS]
_QUERIES = [("a", "q1", 4, '{"colour": ["red"]}', None), ("a", "q2", 5, None, "[0, 3]"),
            ("b", "q3", 4, '{"size": [0, 5]}', None), ("a", "q4", 7, '{"colour": ["red", "blue"]}', None),
            ("a", "early", 2, None, "[1]"), ("b", "never", 50, None, "[2]")]
DB_QUERIES = [{"stream_id": s, "query_id": q, "t": t, "predicate": p, "indices": i} for s, q, t, p, i in _QUERIES]


def _sum_params(template: str):
    v = TEST_VARIABLES
    clock = StepClock(v["start"], v["period"], v["end"])
    if template in ("continual_sum", "streaming_continual_sum"):  # the streaming one reads Pub/Sub, same rows
        return ContinualSumParams(dim=v["dim"], epsilon=v["epsilon"], clip_bound=v["clip_bound"], clock=clock)
    if template == "windowed_sum":
        return WindowedSumParams(dim=v["dim"], epsilon=v["epsilon"], clip_bound=v["clip_bound"], clock=clock,
                                 window=v["window"])
    if template == "continual_count":
        return ContinualCountParams(epsilon=v["epsilon"], clock=clock).as_sum_params()
    raise KeyError(template)


def _params(template: str):
    """The params object the template's transform builds from its test variables."""
    if template in SUMS:
        return _sum_params(template)
    v = FAMILY_VARIABLES[template]
    if template == "model_release":
        return ContinualModelParams(n_features=v["dim"], classes=tuple(v["classes"]), epsilon=v["epsilon"],
                                    clip_bound=v["clip_bound"], update=v["update_size"], base=v["base_size"],
                                    lam=v["lam"])
    if template == "online_learner":
        return OnlineLearnerParams(dim=v["dim"], constraint={"kind": v["constraint"], "radius": v["radius"]},
                                   epsilon=v["epsilon"], window=v["window"], loss=v["loss"])
    if template == "incremental_regression":
        return IncrementalRegressionParams(dim=v["dim"], epsilon=v["epsilon"], delta=v["delta"],
                                           clock=StepClock(v["start"], v["period"], v["end"]))
    if template == "growing_db_queries":
        return GrowingDatabaseParams(universe=parse_universe(json.dumps(v["universe"])), n=v["n"],
                                     epsilon=v["epsilon"], clock=StepClock(v["start"], v["period"], v["end"]))
    raise KeyError(template)


def _dead(reason: str, detail: str, event: dict, counting: bool = False) -> dict:
    value = 1.0 if counting else [event["value_0"]]  # ContinualCount replaces each value by 1
    element = {"stream_id": event["stream_id"], "timestamp": event["timestamp"], "value": value}
    return _letter(reason, detail, event["stream_id"], element)


def _letter(reason: str, detail: str, stream, element) -> dict:
    """A YAML dead-letter row: the element as JSON text of its values (issue 25.7)."""
    return {"reason": reason, "detail": detail, "stream": stream, "source": None,
            "element": json.dumps(json_value(element))}


def _sum_expectations(template: str, domain: str) -> tuple[list, list]:
    params = _params(template)
    counting = template == "continual_count"
    in_schedule = [e for e in EVENTS if e["timestamp"] < TEST_VARIABLES["end"] and (counting or e["value_0"] is not None)]
    ids = [e["stream_id"] for e in in_schedule]
    ts = [e["timestamp"] for e in in_schedule]
    values = np.ones((len(ids), 1)) if counting else [[e["value_0"]] for e in in_schedule]
    releases = [r._asdict() for r in expected_rows(params, ids, ts, values, domain=domain)]
    dead = [_dead("after_end", "timestamp outside the public schedule", EVENTS[5], counting)]
    if not counting:
        dead.append(_dead("bad_value", "value is not a numeric array", EVENTS[4]))
    return releases, dead


def _model_release_expectations(domain: str) -> tuple[list, list]:
    """Blocks of ``update`` valid examples per stream in row order; a partial last block is not released."""
    params = _params("model_release")
    noise = NoiseSource(TEST_KEY).for_domain(domain, calibration_binding(params))
    mech, unit = params.build_mechanism(), params.block_size
    examples = [to_example(row, params.n_features, True) for row in EXAMPLES]
    dead = [_letter("bad_label", "label is not one of the declared classes", "s1", examples[6]),
            _letter("bad_value", "features is not a numeric array", "s1", examples[10]),
            _letter("bad_stream_id", "stream_id must be a non-empty UTF-8 string", None, examples[14])]
    bad = {6, 10, 14}
    releases = []
    for stream in ("s1", "s2"):
        rows = [e for i, e in enumerate(examples) if i not in bad and e[0] == stream]
        x = np.array([r[1] for r in rows])
        y = np.array([params.classes.index(r[2]) for r in rows])
        state = mech.init_state(stream)
        for lo in range(0, len(rows) - unit + 1, unit):
            state, rel = mech.step(state, LabelledRows(x[lo:lo + unit], y[lo:lo + unit]), noise)
            releases += [release_to_row(r, mech.guarantee)._asdict() for r in rel]
    return releases, dead


def _online_learner_expectations(domain: str) -> tuple[list, list]:
    params = _params("online_learner")
    noise = NoiseSource(TEST_KEY).for_domain(domain, calibration_binding(params))
    mech = params.build_mechanism()
    records = [to_record(row, params.dim, False) for row in ONLINE_ROWS]
    dead = [_letter("bad_value", "logistic labels must be -1 or +1", "a", records[3]),
            _letter("bad_value", "features is not a numeric array", "a", records[6])]
    releases = []
    for stream in ("a", "b"):
        recs = [mech.record(np.asarray(f, np.float64), y) for i, (s, f, y) in enumerate(records)
                if s == stream and i not in (3, 6)]
        releases += [release_to_row(r, mech.guarantee)._asdict() for r in mech.run(stream, recs, noise)]
    return releases, dead


def _incremental_regression_expectations(domain: str) -> tuple[list, list]:
    params = _params("incremental_regression")
    noise = NoiseSource(TEST_KEY).for_domain(domain, calibration_binding(params))
    mech, clock = params.build_mechanism(), params.clock
    records = [to_record(row, params.dim, True) for row in REGRESSION_ROWS]
    dead = [_letter("after_end", "timestamp outside the public schedule", "a", records[-1])]
    releases = []
    for stream in ("a", "b"):
        steps = [[] for _ in range(clock.last_step)]
        for s, ts, f, y in records[:-1]:
            if s == stream:
                steps[int(clock.step_of_micros(round(ts * 1e6))) - 1].append(mech.record(np.asarray(f, np.float64), y))
        blocks = [mech.merge_blocks(items) if items else None for items in steps]
        releases += [release_to_row(r, mech.guarantee, clock.step_start_micros(r.step),
                                    clock.step_end_micros(r.step))._asdict() for r in mech.run(stream, blocks, noise)]
    return releases, dead


def _weights(query: dict, universe):
    return universe.predicate(query["predicate"]) if query["predicate"] is not None \
        else universe.counting_query(query["indices"])


def _growing_db_expectations(domain: str) -> tuple[list, list]:
    params = _params("growing_db_queries")
    noise = NoiseSource(TEST_KEY).for_domain(domain, calibration_binding(params))
    universe, mech = params.universe, params.build_mechanism()
    elements = [to_element(row, universe) for row in DB_ELEMENTS]
    queries = [to_query(row, universe.size) for row in DB_QUERIES]
    dead = [_letter("outside_universe", "the record is not in the declared universe", "a", elements[4]),
            _letter("after_end", "timestamp outside the public schedule", "a", elements[-1]),
            _letter("before_start", f"queries need t >= n = {params.n}", "a", queries[4]),
            # a query still pending at the end: the whole query, weights as a list
            _letter("after_end", "the database never reached size 50", "b",
                    {"query_id": queries[5]["query_id"], "t": queries[5]["t"],
                     "weights": np.asarray(_weights(queries[5], universe), dtype=float).tolist()})]
    releases = []
    for stream in ("a", "b"):
        els = [(e["timestamp"], universe.encode_one(e["value"])) for i, e in enumerate(elements)
               if e["stream_id"] == stream and i not in (4, len(elements) - 1)]
        qs = [(q["query_id"], q["t"], _weights(q, universe)) for q in queries[:4] if q["stream_id"] == stream]
        rel, _ = replay_growing_database(params, stream, els, qs, noise)
        releases += [release_to_row(r, mech.guarantee)._asdict() for r in rel]
    return releases, dead


def _reads(template: str) -> list[dict]:
    if template in SUMS:
        return [{"name": "ReadEvents", "elements": EVENTS}]
    rows = {"model_release": EXAMPLES, "online_learner": ONLINE_ROWS, "incremental_regression": REGRESSION_ROWS}
    if template in rows:
        return [{"name": "ReadRows", "elements": rows[template]}]
    return [{"name": "ReadElements", "elements": DB_ELEMENTS}, {"name": "ReadQueries", "elements": DB_QUERIES}]


def expectations(template: str, domain: str | None = None) -> tuple[list[dict], list[dict]]:
    """``(releases, dead letters)`` of ``template`` on its mocked rows: the pure mechanism's releases
    under the test key in noise domain ``domain`` (default: the one the template binds under
    ``--test``), as release-row dicts sorted by (stream, step, query id), and dead letters sorted."""
    domain = domain or YAML_DOMAINS.get(template, template)
    if template in SUMS:
        releases, dead = _sum_expectations(template, domain)
    else:
        releases, dead = {"model_release": _model_release_expectations,
                          "online_learner": _online_learner_expectations,
                          "incremental_regression": _incremental_regression_expectations,
                          "growing_db_queries": _growing_db_expectations}[template](domain)
    params = _params(template)
    labels = ReleaseLabels(domain, composition_of(params.build_mechanism()), None)
    releases = [labels(ReleaseRow(**r))._asdict() for r in releases]
    return (sorted(releases, key=lambda r: (r["stream"], r["step"], r["meta"])),
            sorted(dead, key=lambda d: (d["reason"], d["element"])))


#: Beam YAML's ``tests:`` compare elements exactly, and a release's floats (values, spends, ``noise_std``
#: in meta) carry the platform's last bits (libm, BLAS): the blocks check the dead letters only (inputs
#: echoed back, exact by construction), and every sum template's releases are compared with the pure
#: mechanism within a tolerance by tests/templates/test_yaml_templates.py (tests/release_checks.py).
#: The noise domain each template's transform binds under `apache_beam.yaml.main --test` (its full label there).
YAML_DOMAINS = {"continual_count": "YamlTransform/Composite/ContinualCount/Release/Sum"}


def tests_block(template: str) -> list[dict]:
    """The ``tests:`` block of ``templates/yaml/<template>.yaml``."""
    _, dead = expectations(template)
    return [{
        "name": f"{template}_dead_letters",
        "mock_outputs": _reads(template),
        "expected_inputs": [{"name": "WriteDeadLetters", "elements": dead}],
    }]


MARKER = "# The test runs with the Jinja variables"


def write_block(template: str) -> None:
    """Replace the ``tests:`` block at the end of ``templates/yaml/<template>.yaml``."""
    path = Path(__file__).resolve().parents[2] / "templates" / "yaml" / f"{template}.yaml"
    text = path.read_text()
    head = text[: text.index(MARKER)] if MARKER in text else text
    where = "TEST_VARIABLES" if template in SUMS else f"FAMILY_VARIABLES[{template!r}]"
    block = yaml.safe_dump({"tests": tests_block(template)}, sort_keys=False, width=120)
    path.write_text(head + MARKER + f" of tests/templates/yaml_expectations.py ({where}) and the\n"
                    "# test noise key in BEAM_DP_NOISE_KEY; the expectations are the pure mechanism's releases "
                    "(checked there).\n" + block)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        for name in TEMPLATES:
            write_block(name)
    else:
        print(yaml.safe_dump({"tests": tests_block(sys.argv[1])}, sort_keys=False, width=120))
