"""The YAML templates' ``tests:`` blocks, derived from the pure mechanisms under the test key.

``tests/templates/test_yaml_templates.py`` checks that every template's block equals what this
module derives (so the YAML expectations are the pure mechanism's releases, not snapshots) and
then runs ``python -m apache_beam.yaml.main --test`` on each template. After a deliberate change
of a mechanism (its noise, meta or name), rewrite the blocks in place with
``BEAM_DP_NOISE_KEY=$(python -c 'print(bytes(range(32)).hex())') python -m tests.templates.yaml_expectations --write``.

Inputs are dyadic numbers, so sums are exact whatever the order Beam adds them in.
"""

from __future__ import annotations

import sys

import numpy as np
import yaml

from beam_dp.beam import ContinualCountParams, ContinualSumParams, WindowedSumParams
from beam_dp.core import StepClock
from tests.beam.helpers import expected_rows

#: Jinja variables the YAML tests run with (no file is read or written: sources and sinks are mocked).
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


def _params(template: str):
    v = TEST_VARIABLES
    clock = StepClock(v["start"], v["period"], v["end"])
    if template == "continual_sum":
        return ContinualSumParams(dim=v["dim"], epsilon=v["epsilon"], clip_bound=v["clip_bound"], clock=clock)
    if template == "windowed_sum":
        return WindowedSumParams(dim=v["dim"], epsilon=v["epsilon"], clip_bound=v["clip_bound"], clock=clock,
                                 window=v["window"])
    if template == "continual_count":
        return ContinualCountParams(epsilon=v["epsilon"], clock=clock).as_sum_params()
    raise KeyError(template)


def _dead(reason: str, detail: str, event: dict, counting: bool = False) -> dict:
    value = 1.0 if counting else [event["value_0"]]  # ContinualCount replaces each value by 1
    element = {"stream_id": event["stream_id"], "timestamp": event["timestamp"], "value": value}
    return {"reason": reason, "detail": detail, "stream": event["stream_id"], "element": repr(element)}


def tests_block(template: str) -> list[dict]:
    """The ``tests:`` block of ``templates/yaml/<template>.yaml``."""
    params = _params(template)
    counting = template == "continual_count"
    in_schedule = [e for e in EVENTS if e["timestamp"] < TEST_VARIABLES["end"] and (counting or e["value_0"] is not None)]
    ids = [e["stream_id"] for e in in_schedule]
    ts = [e["timestamp"] for e in in_schedule]
    values = np.ones((len(ids), 1)) if counting else [[e["value_0"]] for e in in_schedule]
    releases = sorted((r._asdict() for r in expected_rows(params, ids, ts, values)),
                      key=lambda r: (r["stream"], r["step"]))
    dead = [_dead("after_end", "timestamp outside the public schedule", EVENTS[5], counting)]
    if not counting:
        dead.append(_dead("bad_value", "not a numeric array", EVENTS[4]))
    return [{
        "name": f"{template}_releases_equal_the_pure_mechanism",
        "mock_outputs": [{"name": "ReadEvents", "elements": EVENTS}],
        "expected_inputs": [
            {"name": "WriteReleases", "elements": releases},
            {"name": "WriteDeadLetters", "elements": sorted(dead, key=lambda d: d["reason"])},
        ],
    }]


MARKER = "# The test runs with the Jinja variables"
TEMPLATES = ("continual_sum", "continual_count", "windowed_sum")


def write_block(template: str) -> None:
    """Replace the ``tests:`` block at the end of ``templates/yaml/<template>.yaml``."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "templates" / "yaml" / f"{template}.yaml"
    text = path.read_text()
    head = text[: text.index(MARKER)] if MARKER in text else text
    block = yaml.safe_dump({"tests": tests_block(template)}, sort_keys=False, width=120)
    path.write_text(head + MARKER + " of tests/templates/yaml_expectations.py (TEST_VARIABLES) and the\n"
                    "# test noise key in BEAM_DP_NOISE_KEY; the expectations are the pure mechanism's releases "
                    "(checked there).\n" + block)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        for name in TEMPLATES:
            write_block(name)
    else:
        print(yaml.safe_dump({"tests": tests_block(sys.argv[1])}, sort_keys=False, width=120))
