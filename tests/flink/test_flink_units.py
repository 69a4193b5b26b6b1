"""Privacy units on native Flink (``beam_dp.flink.units``): a unit-level job at parallelism 1 (a replay) and 4
(streaming: watermarks, the gates), and the entry point ``beam_dp.flink.run --privacy-unit`` on CSV files,
release what the Beam batch replay releases on the same events, key and params (the same noise binding:
equal within 1e-9), with the same dead letters and no clear id in them. The jobs need .venv-flink
(``make flink-test``; skipped in the main venv). ``python -m tests.flink.test_flink_units OUT [cli]``
(main venv, Beam 2.77) writes the Beam side's rows (``cli``: under the entry point's params)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from beam_dp.beam import ContinualSumParams
from beam_dp.mechanisms.sums.unit_level import PrivacyUnit
from beam_dp.steps.params import NoiseKey
from tests.flink.cases import CLOCK, DOMAIN, STREAMS, assert_rows_equal

ROOT = Path(__file__).resolve().parents[2]
UNIT = PrivacyUnit("user", max_streams_per_step=1, max_contributions_per_step=2, max_steps=3, min_separation=2)
PARAMS = ContinualSumParams(dim=2, epsilon=1.0, clip_bound=1.0, noise="gamma", counter="tree", calibration="paper",
                            clock=CLOCK, streams=STREAMS, noise_key=NoiseKey(domain=DOMAIN))
BAD = [(("a", 1011.0, [0.1, 0.1], ""), "bad_unit_id"), (("a", 1012.0, [float("nan"), 0.0], "u1"), "non_finite")]


def unit_events(n: int = 80, seed: int = 3) -> list[tuple]:
    """In time order: ``(stream, seconds, [v0, v1], user)`` of 6 users, many over the bounds, and the bad rows."""
    rng = np.random.default_rng(seed)
    ts = np.sort(CLOCK.start + rng.random(n) * (CLOCK.end - CLOCK.start - 15.0))
    good = [(str(s), float(t), v.tolist(), f"u{int(u)}") for s, t, v, u in
            zip(rng.choice(["a", "b"], n), ts, rng.normal(0.3, 0.8, (n, 2)), rng.integers(0, 6, n))]
    return sorted(good + [e for e, _ in BAD], key=lambda e: e[1])


#: the entry point's flags of PARAMS' schedule and streams with UNIT's bounds (counter "tree")
CLI = ["--start", str(CLOCK.start), "--period", str(CLOCK.period), "--end", str(CLOCK.end), "--dim", "2",
       "--streams", ",".join(STREAMS), "--counter", "tree", "--privacy-unit", "user", "--max-unit-steps", "3",
       "--min-separation", "2", "--max-contributions-per-step", "2"]


def cli_params():
    """The unit-level params ``beam_dp.flink.run`` builds from :data:`CLI`, in its noise domain."""
    from beam_dp.flink.run import UID, _args, _params

    params = _params(_args(["--input", "in", "--output", "out", *CLI]))
    return dataclasses.replace(params, noise_key=dataclasses.replace(params.noise_key, domain=UID))


def csv_lines(events: list[tuple]) -> str:
    """Events as the entry point's unit lines ``stream,seconds,unit,v0,v1``."""
    return "".join(f"{s},{t!r},{u},{','.join(map(repr, v))}\n" for s, t, v, u in events)


def beam_outputs(params, events: list[tuple]) -> dict[str, list]:
    """The Beam batch replay's release rows (JSON columns) and dead-letter reasons of ``events`` under
    unit-level ``params``."""
    import apache_beam as beam
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_dp.beam import ContinualSum

    with tempfile.TemporaryDirectory() as folder:
        with beam.Pipeline(options=PipelineOptions([], runner="FnApiRunner")) as p:
            out = p | beam.Create(events) | ContinualSum(params)
            _ = (out.releases | "rows" >> beam.Map(lambda r: json.dumps(r._asdict(), default=str))
                 | "write rows" >> beam.io.WriteToText(f"{folder}/releases"))
            _ = (out.dead_letter | "reasons" >> beam.Map(lambda d: d.reason)
                 | "write dead" >> beam.io.WriteToText(f"{folder}/dead"))
        result = {}
        for name in ("releases", "dead"):
            paths = [m.path for m in FileSystems.match([f"{folder}/{name}*"])[0].metadata_list]
            lines = [line for path in paths for line in open(path).read().splitlines() if line.strip()]
            result[name] = [json.loads(line) for line in lines] if name == "releases" else sorted(lines)
    return result


@pytest.fixture(autouse=True)
def _workers_see_beam_dp(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def _flink(parallelism: int, replay: bool) -> tuple[list[dict], list[str]]:
    from beam_dp.flink.job import EVENT_TYPE, local_environment
    from beam_dp.flink.units import unit_event, unit_release_stream

    env = local_environment(parallelism, replay=replay)
    source = env.from_collection([unit_event(*e) for e in unit_events()], type_info=EVENT_TYPE)
    releases, dead = unit_release_stream(env, source, PARAMS.with_privacy_unit(UNIT), uid=DOMAIN)
    tagged = releases.map(lambda j: "release\t" + j).union(dead.map(lambda j: "dead\t" + j))
    with tagged.execute_and_collect() as results:
        outputs = [r.split("\t", 1) for r in results]
    rows = [json.loads(j) for kind, j in outputs if kind == "release"]
    letters = [json.loads(j) for kind, j in outputs if kind == "dead"]
    assert "u1" not in json.dumps(letters)  # no clear id in a dead letter
    return rows, sorted(d["reason"] for d in letters)


def _beam(tmp_path, *cli: str) -> dict:
    """The Beam side's outputs, from the main venv (this venv's PyFlink pins an older Beam)."""
    python = ROOT / ".venv" / "bin" / "python"
    assert python.exists(), "the main venv (.venv) runs the Beam side: `make install-test` first"
    out = tmp_path / "beam.json"
    subprocess.run([str(python), "-m", "tests.flink.test_flink_units", str(out), *cli], cwd=ROOT, check=True,
                   capture_output=True, timeout=600)
    return json.loads(out.read_text())


@pytest.mark.slow
def test_parallelism_1_and_4_equal_the_beam_batch_replay(tmp_path):
    pytest.importorskip("pyflink")
    beam = _beam(tmp_path)
    want = sorted(beam["releases"], key=lambda r: (r["stream"], r["step"]))
    assert len(want) == len(STREAMS) * CLOCK.last_step and json.loads(want[0]["meta"])["privacy_unit"] == "user"
    assert beam["dead"] == sorted(r for _, r in BAD)
    for parallelism, replay in ((1, True), (4, False)):
        rows, reasons = _flink(parallelism, replay)
        assert_rows_equal(rows, want)
        assert reasons == beam["dead"]


@pytest.mark.slow
def test_the_entry_point_with_privacy_units_equals_the_beam_batch_replay(tmp_path):
    pytest.importorskip("pyflink")
    from beam_dp.flink.run import main

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "events.csv").write_text(csv_lines(unit_events()))
    out, private = tmp_path / "out", tmp_path / "out.private"
    assert main(["--input", str(tmp_path / "in"), "--output", str(out), *CLI]) == 0

    def read(folder):
        return [json.loads(line) for f in sorted(folder.rglob("*")) if f.is_file() and not f.name.startswith((".", "_"))
                for line in f.read_text().splitlines() if line]

    beam = _beam(tmp_path, "cli")
    assert_rows_equal(read(out), sorted(beam["releases"], key=lambda r: (r["stream"], r["step"])))
    letters = read(private)
    assert sorted(d["reason"] for d in letters) == beam["dead"] and "u1" not in json.dumps(letters)
    assert json.loads((out / "_beam_dp_manifest.json").read_text())["transforms"][0]["privacy_unit"] == "user"


RESTORE_EVENTS = 20_000  # enough that the job is still reading them at its stop


@pytest.mark.slow
@pytest.mark.long  # ~10 minutes on a shared 2-core machine: make flink-test-long
@pytest.mark.skipif(shutil.which("java") is None, reason="a standalone Flink cluster needs Java")
def test_a_savepoint_resumed_at_another_parallelism_keeps_every_units_bounding(tmp_path):
    """The entry point in streaming mode on a standalone cluster (two TaskManagers of two slots): stopped
    with a savepoint at parallelism 4 mid-input, resumed at 2. The releases equal the Beam batch replay's
    of the whole input: each unit's row (steps taken, exhausted) came back with its key group, so no unit
    took part again after the restore (6 units over 10 steps with at most 3 steps each: a row lost at the
    restore would let its unit in again and change the sums by whole contributions, far beyond 1e-9)."""
    pytest.importorskip("pyflink")
    from tests.conftest import TEST_KEY
    from tests.flink.standalone import StandaloneCluster
    from tests.flink.test_cluster_metrics import OPERATIONS, _cluster_lib

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "events.csv").write_text(csv_lines(unit_events(RESTORE_EVENTS)))
    package = shutil.make_archive(str(tmp_path / "beam_dp"), "zip", ROOT, "beam_dp")  # what -pyfs ships
    env = {"BEAM_DP_NOISE_KEY": TEST_KEY.hex(), "PYTHONPATH": "", "FLINK_LIB_DIR": str(_cluster_lib(tmp_path / "lib"))}

    def job_args(parallelism: int) -> list[str]:
        return ["-pym", "beam_dp.flink.run", "-pyfs", package, "--input", str(tmp_path / "in"), "--output",
                str(tmp_path / "out"), "--streaming", "--checkpoint-ms", "500", "--parallelism", str(parallelism),
                "--checkpoint-dir", str(tmp_path / "checkpoints"), *CLI]

    with StandaloneCluster(tmp_path / "cluster", env=env, slots=2, settings=OPERATIONS) as cluster:
        def running_job() -> str | None:
            jobs = [j for j in cluster.rest("/jobs/overview")["jobs"] if j["state"] == "RUNNING"]
            return jobs[0]["jid"] if jobs else None

        cluster.start_taskmanager()
        cluster.start_taskmanager()
        client = cluster.submit(job_args(4))
        job = cluster.wait(running_job, 600, "the submitted job")
        cluster.wait(lambda: cluster.rest(f"/jobs/{job}/checkpoints")["counts"]["completed"] >= 1, 600, "a checkpoint")
        savepoint = cluster.stop_with_savepoint(job, client, tmp_path / "savepoints")
        client = cluster.submit(["-s", savepoint, *job_args(2)])
        assert client.wait(900) == 0, cluster.log_tail()

    rows = [json.loads(line) for f in sorted((tmp_path / "out").rglob("*")) if f.is_file()
            and not f.name.startswith((".", "_")) for line in f.read_text().splitlines() if line]
    beam = _beam(tmp_path, "cli", str(RESTORE_EVENTS))
    assert_rows_equal(rows, sorted(beam["releases"], key=lambda r: (r["stream"], r["step"])))


def test_unit_flags_need_the_unit_and_its_steps(capsys):
    from beam_dp.flink.run import _args, parse_unit_line

    base = ["--input", "in", "--output", "out", "--start", "0", "--period", "10"]
    for flags, fix in ((["--max-unit-steps", "2"], "give --privacy-unit"), (["--privacy-unit", "user"],
                                                                           "needs --max-unit-steps")):
        with pytest.raises(SystemExit):
            _args(base + flags)
        assert fix in capsys.readouterr().err
    params = cli_params()
    assert params.privacy_unit.column == "user" and params.unit_bounds().max_steps == 3
    pytest.importorskip("pyflink")  # the payload class lives beside the Flink functions
    stream, seconds, payload = parse_unit_line("a,12.5,ann,x,1\n")
    assert (stream, seconds, payload.unit) == ("a", 12.5, "ann") and "ann" not in payload.value  # the line sans id


if __name__ == "__main__":  # OUT [cli [events]]
    with open(sys.argv[1], "w") as fh:
        json.dump(beam_outputs(cli_params() if sys.argv[2:3] == ["cli"] else PARAMS.with_privacy_unit(UNIT),
                               unit_events(int(sys.argv[3])) if len(sys.argv) > 3 else unit_events()), fh)
