"""Per-record families' privacy units on Flink (:mod:`beam_dp.flink.record_units`) equal the Beam batch replay:
the same unit-level params, records and key give the same releases (within 1e-9) and dead letters, a unit over
k keeping k. Event-time incremental regression (a step sums its records, so the order the unit stage delivers
them in does not matter); the over-k unit sends identical records, so any k kept are the same. Needs
.venv-flink (``make flink-test``; skipped in the main venv); the Beam side runs in the main venv
(:mod:`tests.flink.record_units_reference`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("pyflink")

from beam_dp.flink.families import family_event, family_stream  # noqa: E402
from beam_dp.flink.job import EVENT_TYPE, local_environment  # noqa: E402
from tests.conftest import TEST_KEY  # noqa: E402
from tests.flink.family_cases import assert_same_rows, letter_counts  # noqa: E402
from tests.flink.record_units_reference import ANN, elements, params  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv" / "bin" / "python"  # the Beam side (Beam 2.77; this venv's PyFlink pins an older Beam)


@pytest.fixture(autouse=True)
def _job_env(monkeypatch):
    monkeypatch.setenv("BEAM_DP_NOISE_KEY", TEST_KEY.hex())
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def _flink() -> dict[str, list]:
    env = local_environment(1)
    events = env.from_collection([family_event(e) for e in elements()], type_info=EVENT_TYPE)
    releases, _, dead = family_stream(env, events, params(), stamp=False)
    tagged = releases.map(lambda j: "releases\t" + j).union(dead.map(lambda j: "dead\t" + j))
    out: dict[str, list] = {"releases": [], "dead": []}
    with tagged.execute_and_collect() as records:
        for record in records:
            name, text = record.split("\t", 1)
            out[name].append(json.loads(text))
    return out


@pytest.mark.slow
def test_a_unit_over_k_keeps_k_and_the_releases_equal_the_beam_batch_replay(tmp_path):
    assert PYTHON.exists(), "the main venv (.venv) runs the Beam side: `make install-test` first"
    subprocess.run([str(PYTHON), "-m", "tests.flink.record_units_reference", str(tmp_path / "beam.json")], cwd=ROOT,
                   check=True, capture_output=True, timeout=600)
    beam = json.loads((tmp_path / "beam.json").read_text())
    got = _flink()
    assert_same_rows(got["releases"], beam["unbounded"]["releases"])
    assert_same_rows(got["releases"], beam["bounded"]["releases"])  # ann's 5 records released as 2
    assert all((r["meta"] if isinstance(r["meta"], dict) else json.loads(r["meta"]))["max_records"] == 2
               for r in got["releases"])
    assert letter_counts(got["dead"]) == letter_counts(beam["unbounded"]["dead"]) == {"bad_unit_id/None": 2}
    assert all(d["stage"] == "parse" for d in got["dead"])
    assert "ann" not in json.dumps(got["dead"])


def _entry_point_inputs(folder: Path) -> dict[str, tuple[list[str], str, int]]:
    """Each job's flags over small CSV files with a unit column (one over-k unit of identical rows, one bad id),
    its release folder and how many releases it writes."""
    rows = ["a,11.0,0.5,-0.25,0.75,ann" for _ in range(6)] + [
        f"{'ab'[i % 2]},{12.0 + 6 * i},{0.1 * i},0.2,-0.5,u{i}" for i in range(5)] + ["b,30.0,0.1,0.1,0.1,"]
    (folder / "r.csv").write_text("stream_id,timestamp,x_0,x_1,label,user\n" + "\n".join(rows) + "\n")
    elements = ["s,1.5,red,big" for _ in range(8)] + [f"s,{12.0 + 2 * i},{('red', 'green')[i % 2]},u{i}"
                                                       for i in range(12)] + ["s,30.0,red,"]
    (folder / "e.csv").write_text("stream_id,timestamp,colour,user\n" + "\n".join(elements) + "\n")
    (folder / "q.csv").write_text("stream_id,query_id,t,indices\n" + "".join(f's,q{t},{t},"[0]"\n'
                                                                             for t in range(4, 20, 4)))
    unit = ["--privacy-unit-column=user", "--max-unit-records=2"]
    return {
        "online_learning": ([f"--input={folder / 'r.csv'}", "--learner=regression", "--start=0", "--period=10",
                             "--end=40", "--epsilon=50", "--delta=1e-6", *unit], "models", 2 * 4),
        "growing_db_queries": ([f"--input={folder / 'e.csv'}", f"--queries={folder / 'q.csv'}",
                                '--universe={"colour": ["red", "green"]}', "--n=4", "--start=0", "--period=10",
                                "--end=50", *unit], "answers", 3),  # 2 + 12 elements kept: q16 never
    }


@pytest.mark.slow
@pytest.mark.parametrize("job", ["online_learning", "growing_db_queries"])
def test_the_entry_point_bounds_the_unit_column_as_the_beam_batch_job(job, tmp_path):
    """``--privacy-unit-column`` on ``python -m pipelines.flink_job`` (a file replay, parallelism 2) writes
    the releases and dead letters of ``python -m pipelines.<job>`` with the same flags (a growing database's
    queries carry no unit and pass the unit stage by)."""
    from pipelines.flink_job import main

    argv, name, releases = _entry_point_inputs(tmp_path)[job]
    beam_out, flink_out = tmp_path / "beam", tmp_path / "flink"
    subprocess.run([str(PYTHON), "-m", f"pipelines.{job}", *argv, f"--output={beam_out}", "--format=jsonl"],
                   cwd=ROOT, check=True, capture_output=True, timeout=600)
    assert main(["--job", job, "--parallelism=2", *argv, f"--output={flink_out}"]) == 0

    def read(folder: Path, pattern: str) -> list[dict]:
        return [json.loads(line) for path in sorted(folder.glob(pattern)) for line in path.read_text().splitlines()
                if line.strip()]

    want = read(beam_out, f"{name}-*.jsonl")
    assert len(want) == releases
    assert_same_rows(read(flink_out, f"{name}/*/part-*"), want)
    letters = letter_counts(read(Path(f"{flink_out}.private"), "*/part-*"))
    assert letters == letter_counts(read(Path(f"{beam_out}.private"), "*.jsonl")) and letters["bad_unit_id/None"] == 1


class _Context:
    """PyFlink's runtime context as far as the unit functions use it: one keyed ValueState per unit hash
    (the test sets the key), kept across a restore as a checkpoint keeps it, and the metrics."""

    def __init__(self):
        from tests.flink.test_shell_rules import Metrics

        self.states, self.key, self.metrics = {}, None, Metrics()

    def get_metrics_group(self):
        return self.metrics

    def get_state(self, descriptor):
        from tests.flink.test_shell_rules import _Value

        context = self

        class Keyed:  # the state of the key in hand
            def value(self):
                return context.states.setdefault(context.key, _Value()).value()

            def update(self, data):
                context.states.setdefault(context.key, _Value()).update(data)

        return Keyed()


def test_a_restored_unit_never_regains_a_record():
    """The unit functions on a scripted context: ids hashed (no clear id after them), each unit's count in
    keyed state; a fresh function on the same state (a restore, or a rescale that moved the key) keeps
    counting where the checkpoint left it, so ann's third record is dropped after the restore as before it."""
    from beam_dp.flink.families import Elements
    from beam_dp.flink.record_units import KeepRecordsFunction, RecordUnitIds

    unit_params = params()
    context = _Context()
    ids = RecordUnitIds(unit_params)
    ids.open(context)
    hashed = [out for element in [ANN, ANN, ANN, ANN[:4] + ("bob",), ANN[:4] + ("",)]
              for out in ids.process_element(("a", 11.0, Elements("elements", (element,))), None)]
    letters = [out for out in hashed if out[0] is not None and not isinstance(out[0], int)]
    records = [out for out in hashed if isinstance(out[0], int)]
    assert len(records) == 4 and len(letters) == 1 and "ann" not in repr(records) + repr(letters)
    assert len({r[0] for r in records}) == 2  # ann's three share a hash, bob's is another
    kept = []
    for i, record in enumerate(records):
        if i in (0, 2):  # a fresh function on the checkpointed keyed state
            keep = KeepRecordsFunction(unit_params.privacy_unit.max_records)
            keep.open(context)
        context.key = record[0]
        kept += list(keep.process_element(record, None))
    assert len(kept) == 3  # ann 2 (one before the restore, one after), bob 1: ann's third dropped
    assert context.metrics.store["gauges"]["beam_dp.dropped_over_records"]() == 1
    assert all(k[:2] == ("a", 11.0) and k[2].elements == (ANN[:4],) for k in kept)  # the records without the id
