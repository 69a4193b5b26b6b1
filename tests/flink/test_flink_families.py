"""Every per-record family on Flink equals its Beam batch transform: the same params, input and key give the
same releases (within 1e-9), snapshots and dead letters, at parallelism 1 and 4. Needs .venv-flink (``make
flink-test``; skipped in the main venv); the Beam side runs in the main venv (:mod:`tests.flink.family_reference`)."""

from __future__ import annotations

import json
import os
import subprocess
from functools import partial
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyflink")

from beam_dp.flink.families import family_event, family_of, family_stream  # noqa: E402
from beam_dp.flink.job import EVENT_TYPE, local_environment  # noqa: E402
from tests.conftest import TEST_KEY  # noqa: E402
from tests.flink.family_cases import assert_same_rows, cases, letter_counts  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _pythonpath() -> str:
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


@pytest.fixture(autouse=True)
def _workers_see_beam_dp(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", _pythonpath())


@pytest.fixture(scope="module")
def _job_env():
    """The module's jobs (built before any test's own fixtures) see the test key and beam_dp."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BEAM_DP_NOISE_KEY", TEST_KEY.hex())
        patch.setenv("PYTHONPATH", _pythonpath())
        yield


@pytest.fixture(scope="module")
def beam_side(tmp_path_factory, _job_env) -> dict:
    """The Beam transforms' outputs on the same cases and key (main venv: Beam 2.77)."""
    python = ROOT / ".venv" / "bin" / "python"
    assert python.exists(), "the main venv (.venv) runs the Beam side: `make install-test` first"
    out = tmp_path_factory.mktemp("beam") / "beam.json"
    subprocess.run([str(python), "-m", "tests.flink.family_reference", str(out)], cwd=ROOT, check=True,
                   capture_output=True, timeout=600)
    return json.loads(out.read_text())


def _flink(parallelism: int) -> dict[str, dict[str, list]]:
    """Every case in one local job (each its own release function and noise domain)."""
    env = local_environment(parallelism)
    tagged = None
    for case in cases():
        events = None
        for kind, elements in case.inputs.items():
            stream = env.from_collection([family_event(e, kind=kind) for e in elements], type_info=EVENT_TYPE)
            events = stream if events is None else events.union(stream)
        releases, snapshots, dead = family_stream(env, events, case.params, stamp=False)
        for name, out in (("releases", releases), ("snapshots", snapshots), ("dead", dead)):
            out = out.map(lambda j, tag=f"{case.name}\t{name}\t": tag + j)
            tagged = out if tagged is None else tagged.union(out)
    result: dict[str, dict[str, list]] = {}
    with tagged.execute_and_collect() as records:
        for record in records:
            case, name, text = record.split("\t", 2)
            result.setdefault(case, {}).setdefault(name, []).append(json.loads(text))
    return result


@pytest.fixture(scope="module", params=[1, 4], ids=["parallelism-1", "parallelism-4"])
def flink_side(request, _job_env) -> dict:
    return _flink(request.param)


@pytest.mark.parametrize("case", cases(), ids=lambda c: c.name)
def test_flink_equals_the_beam_batch_transform(case, flink_side, beam_side):
    got, want = flink_side.get(case.name, {}), beam_side[case.name]
    assert want["releases"], "the case releases something"
    assert_same_rows(got.get("releases", []), want["releases"])
    assert_same_rows(got.get("snapshots", []), want.get("snapshots", []))
    assert letter_counts(got.get("dead", [])) == letter_counts(want["dead"])
    assert letter_counts(want["dead"])  # every case has refused elements


def test_params_flink_cannot_run_are_refused_when_the_job_is_built():
    from beam_dp.beam import ContinualSumParams, IncrementalRegressionParams
    from beam_dp.core import StepClock

    with pytest.raises(ValueError, match="Flink runs no family of ContinualSumParams"):
        family_of(ContinualSumParams(dim=1, epsilon=1.0, clip_bound=1.0, clock=StepClock(0.0, 1.0, 4.0)))
    with pytest.raises(ValueError, match="whole ms"):
        family_of(IncrementalRegressionParams(dim=1, epsilon=1.0, delta=1e-6, clock=StepClock(0.0, 1.0005, 4.0)))


def _job_inputs(folder: Path) -> dict[str, list[str]]:
    """Each Beam job's flags over small CSV files (a few bad rows among them): what both engines run."""
    rng = np.random.default_rng(11)
    rows = [(str(rng.choice(["a", "b"])), *rng.normal(0, 0.5, 2).tolist()) for _ in range(40)]
    (folder / "examples.csv").write_text("stream_id,x_0,x_1,label\n" + "".join(
        f"{s},{x!r},{y!r},{0.5 * x - 0.3 * y!r}\n" for s, x, y in rows) + "a,nan,0.1,0.2\nb,0.1,0.1,text\n")
    times = np.sort(rng.random(len(rows)) * 45.0).tolist()
    (folder / "records.csv").write_text("stream_id,timestamp,x_0,x_1,label\n" + "".join(
        f"{s},{t!r},{x!r},{y!r},{0.5 * x - 0.3 * y!r}\n" for (s, x, y), t in zip(rows, times)) + "a,70.0,0.1,0.1,0.1\n")
    (folder / "elements.csv").write_text("stream_id,timestamp,colour,size\n" + "".join(
        f"{s},{t!r},{rng.choice(['red', 'green'])},{float(rng.integers(0, 3))!r}\n" for (s, _, _), t in zip(rows, times))
        + "a,5.0,purple,1.0\n")
    (folder / "queries.csv").write_text("stream_id,query_id,t,indices\n" + "".join(
        f"{s},q{i},{t},\"[0, 2]\"\n" for i, (s, t) in enumerate([("a", 5), ("a", 9), ("b", 6)])) + "b,never,999,\"[1]\"\n")
    (folder / "tasks.csv").write_text("stream_id,task_id,x_0,x_1,x_2,x_3,label\n" + "".join(
        f"{s},{task},{','.join(repr(v) for v in rng.normal(0, 0.5, 4).tolist())},{int(rng.integers(0, 2))}\n"
        for task in ("t0", "t1") for s, _, _ in rows[:12]) + "a,t9,0,0,0,0,1\n")
    schedule = ["--start=0", "--period=10", "--end=50"]
    return {
        "model_release": [f"--input={folder / 'examples.csv'}", "--update-size=4", "--base-size=8"],
        "online_learning": [f"--input={folder / 'records.csv'}", "--learner=regression", *schedule],
        "growing_db_queries": [f"--input={folder / 'elements.csv'}", f"--queries={folder / 'queries.csv'}",
                               '--universe={"colour": ["red", "green"], "size": {"edges": [0, 1, 2]}}', "--n=4",
                               "--snapshots", *schedule],
        "lifelong": [f"--input={folder / 'tasks.csv'}", "--tasks=t0,t1", "--classes=0,1", "--task-size=12",
                     "--steps-per-task=2", "--device=cpu", "--torch-threads=1"],
    }


def _rows(folder: Path, pattern: str) -> list[dict]:
    return [json.loads(line) for path in sorted(folder.glob(pattern)) for line in path.read_text().splitlines()
            if line.strip()]


@pytest.mark.parametrize("job", ["model_release", "online_learning", "growing_db_queries", "lifelong"])
def test_the_flink_entry_point_equals_the_beam_batch_job(job, tmp_path):
    """``python -m pipelines.flink_job --job <job>`` with the Beam job's flags (parallelism 4) writes the
    releases ``python -m pipelines.<job>`` writes (same params, binding and noise domain, in its manifest)."""
    from beam_dp.io.manifest import read_manifest
    from pipelines.flink_job import main

    argv = _job_inputs(tmp_path)[job]
    beam_out, flink_out = tmp_path / "beam", tmp_path / "flink"
    subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", f"pipelines.{job}", *argv, f"--output={beam_out}",
                    "--format=jsonl"], cwd=ROOT, check=True, capture_output=True, timeout=600)
    assert main(["--job", job, "--parallelism=4", *argv, f"--output={flink_out}"]) == 0
    names = ("answers", "synthetic") if job == "growing_db_queries" else ("models",)
    for name in names:
        want = _rows(beam_out, f"{name}-*.jsonl")
        assert want, name
        assert_same_rows(_rows(flink_out, f"{name}/*/part-*"), want)
    beam_manifest, flink_manifest = read_manifest(str(beam_out)), read_manifest(str(flink_out))
    assert (flink_manifest.epsilon, flink_manifest.delta) == (beam_manifest.epsilon, beam_manifest.delta)
    assert [(t.noise_domain, t.noise_binding, t.mechanism, t.composition, t.epsilon, t.delta)
            for t in flink_manifest.transforms] == [(t.noise_domain, t.noise_binding, t.mechanism, t.composition,
                                                     t.epsilon, t.delta) for t in beam_manifest.transforms]
    assert letter_counts(_rows(Path(f"{flink_out}.private"), "*/part-*")) == letter_counts(
        _rows(Path(f"{beam_out}.private"), "*.jsonl"))


def _messages(case) -> list[str]:
    """A case's inputs as the Kafka messages a Beam job reads (JSON objects with the file columns' names),
    queries first (a query waits for its size; a message arrives once)."""
    from beam_dp.mechanisms.growing_db.universe import Universe

    rows = [{"stream_id": s, "query_id": q, "t": t, "weights": w} for s, q, t, w in case.inputs.get("queries", [])]
    for element in case.inputs["elements"]:
        if isinstance(getattr(case.params, "universe", None), Universe):
            s, t, (colour, size) = element
            rows.append({"stream_id": s, "timestamp": t, "colour": colour, "size": size})
        else:
            s, t, x, y = element
            rows.append({"stream_id": s, "timestamp": t, "label": y, **{f"x_{i}": v for i, v in enumerate(x)}})
    return [json.dumps(row) for row in rows]


def test_kafka_messages_in_streaming_equal_the_beam_batch_transform(beam_side, _job_env):
    """Messages (what ``--source kafka`` reads) through the entry point's reader and the streaming watermark
    (event time, periodic watermarks, the end rule at the end of the input) give the batch releases of
    the event-time families."""
    from types import SimpleNamespace

    from pyflink.common import Types

    from pipelines.flink_job import inputs_of, message_records

    env = local_environment(4, replay=False)
    tagged, outputs = Types.TUPLE([Types.STRING(), Types.PICKLED_BYTE_ARRAY()]), None
    chosen = {c.name: c for c in cases() if c.name in ("regression", "pmwg")}
    for name, case in chosen.items():
        job = SimpleNamespace(params=case.params, event_time=True, pattern=None, elements=None, queries=None)
        inputs = inputs_of("growing_db_queries" if name == "pmwg" else "online_learning", job)
        records = env.from_collection(_messages(case), type_info=Types.STRING()).flat_map(
            partial(message_records, inputs=inputs), output_type=tagged)
        events = records.filter(lambda r: r[0] == "event").map(lambda r: r[1], output_type=EVENT_TYPE)
        releases, _, dead = family_stream(env, events, case.params, stamp=False)
        for kind, out in (("releases", releases), ("dead", dead)):
            out = out.map(lambda j, tag=f"{name}\t{kind}\t": tag + j)
            outputs = out if outputs is None else outputs.union(out)
    got: dict[str, dict[str, list]] = {}
    with outputs.execute_and_collect() as records:
        for record in records:
            name, kind, text = record.split("\t", 2)
            got.setdefault(name, {}).setdefault(kind, []).append(json.loads(text))
    for name in chosen:
        assert_same_rows(got[name]["releases"], beam_side[name]["releases"])
        assert letter_counts(got[name]["dead"]) == letter_counts(beam_side[name]["dead"])


def test_the_entry_point_runs_the_continual_sums_job(tmp_path):
    """``--job continual_stats`` takes the Beam job's flags and writes its releases under ``sum/``."""
    from beam_dp.io.manifest import read_manifest
    from pipelines.flink_job import main
    from tests.flink.cases import csv_lines, good_events

    (tmp_path / "in.csv").write_text("stream_id,timestamp,value_0,value_1\n" + csv_lines(good_events()))
    assert main(["--job", "continual_stats", f"--input={tmp_path / 'in.csv'}", "--start=1000", "--period=10",
                 "--end=1100", "--streams=a,b,silent", f"--output={tmp_path / 'out'}"]) == 0
    assert read_manifest(str(tmp_path / "out")).job == "flink_continual_stats"
    assert _rows(tmp_path / "out", "sum/*/part-*")


@pytest.mark.parametrize("argv, problem", [
    (["--source=pubsub", "--streaming", "--pubsub-topic=projects/p/topics/t", "--dim=2"], "--source pubsub runs on Beam"),
    ([], "give --input"),
])
def test_the_entry_point_refuses_what_flink_does_not_run(argv, problem, tmp_path, capsys):
    from pipelines.flink_job import main

    assert main(["--job", "model_release", f"--output={tmp_path / 'out'}", *argv]) == 2
    assert problem in capsys.readouterr().err



class _List:
    def __init__(self):
        self.items = []

    def add(self, value):
        self.items.append(value)

    def get(self):
        return list(self.items)

    def clear(self):
        self.items = []


def _scripted(params):
    """:class:`tests.flink.test_shell_rules.ScriptedFlink` (keyed state, timers and the watermark moved by
    the test) over the family function: its list buffer, releases without a clock."""
    from beam_dp.flink.families import FamilyReleaseFunction
    from beam_dp.flink.job import DEAD_LETTERS
    from tests.flink import test_shell_rules as rules

    class Handle(rules._KeyedHandle):
        def _of_key(self):
            kinds = {"beam_dp_key_state": rules._Value, "beam_dp_mechanism": rules._Value, "beam_dp_entries": _List}
            return self.flink.states.setdefault(self.flink.key, {k: make() for k, make in kinds.items()})[self.kind]

    class Scripted(rules.ScriptedFlink):
        def __init__(self):
            self.params, self.states, self.timers, self.key, self.firings = params, {}, set(), None, 0
            self.releases, self.dead, self.metrics = [], [], rules.Metrics()
            self.restore()

        def restore(self):
            """A fresh function on the checkpointed keyed state (its bytes) and timers; no watermark yet."""
            self.function = FamilyReleaseFunction(params)
            self.function.open(self)
            self.watermark = rules.MIN_WATERMARK

        def get_state(self, descriptor):
            return Handle(self, descriptor.get_name())

        get_list_state = get_state

        def _collect(self, outputs):
            for out in outputs or ():
                if isinstance(out, tuple) and out[0] is DEAD_LETTERS:
                    self.dead.append(json.loads(out[1]))
                else:
                    self.releases.append(json.loads(out))

    return Scripted()


def test_a_task_marker_releases_at_once_and_a_restore_keeps_the_releases(_job_env):
    """Lifelong in streaming: ``END_OF_TASK`` closes its task when it arrives (a later row of that task is
    ``task_backwards``), the end of the input closes the rest; a restore from the checkpointed state
    between any two elements (the state coder and the list buffer) changes no release."""
    from beam_dp.beam.lifelong import END_OF_TASK
    from beam_dp.flink.families import Elements
    from tests.flink.test_shell_rules import END

    case = next(c for c in cases() if c.name == "lifelong")
    rows = [e for e in case.inputs["elements"] if e[0] == "a" and len(e) == 4 and e[1] in ("t0", "t1")]
    elements = ([e for e in rows if e[1] == "t0"] + [("a", "t0", END_OF_TASK), rows[0]]
                + [e for e in rows if e[1] == "t1"])
    runs = []
    for restore_at in (None, 2, len(elements) - 1):
        flink = _scripted(case.params)
        for i, element in enumerate(elements):
            if i == restore_at:
                flink.restore()
            flink.element("a", 0.0, Elements("elements", (element,)))
            if element[2] is END_OF_TASK:
                assert [r["step"] for r in flink.releases] == [1]  # task t0, at its marker
        flink.advance(END)  # the end of the input
        assert [r["step"] for r in flink.releases] == [1, 2]
        assert letter_counts(flink.dead) == {"task_backwards/a": 1}
        runs.append(flink.releases)
    for run in runs[1:]:
        assert_same_rows(run, runs[0], tolerance=0.0)
