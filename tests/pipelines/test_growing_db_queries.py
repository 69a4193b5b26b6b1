"""The growing-database job end to end: two input files, answers equal the pure mechanism, dead letters,
one-line usage errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from beam_dp.beam.growing_db import GrowingDatabaseParams, replay_growing_database
from beam_dp.core import NoiseSource, StepClock
from beam_dp.io import read_releases, release_to_row
from beam_dp.io.manifest import read_manifest
from pipelines import growing_db_queries as job
from tests.beam.helpers import domain_noise, labelled
from tests.conftest import TEST_KEY
from tests.pipelines.jobs_helpers import assert_usage_error, dead_letters

pytestmark = pytest.mark.pipeline

PROG = "python -m pipelines.growing_db_queries"
UNIVERSE_JSON = '{"colour": ["red", "green", "blue"], "size": {"edges": [0, 1, 5, 10]}}'
UNIVERSE = job.parse_universe(UNIVERSE_JSON)
COLOURS = ("red", "green", "blue")


def _data(seed=0):
    rng = np.random.default_rng(seed)
    elements, queries = [], []
    for stream in ("a", "b"):
        for t in np.sort(rng.uniform(0, 50, 30)):
            elements.append((stream, float(t), str(rng.choice(COLOURS)), float(rng.uniform(0, 10))))
        for k, t in enumerate(range(10, 31, 5)):
            if k % 2:
                queries.append((stream, f"p{k}", t, {"colour": ["red", "blue"], "size": [0, 5]}, None))
            else:
                queries.append((stream, f"i{k}", t, None, [0, 4, 8]))
    return elements, queries


DOMAIN = "GrowingDatabaseQueries"  # the job's label of the transform: its noise domain


def _expected(params, elements, queries, binding=None):
    """The pure mechanism's rows; ``binding``: the job's noise binding (its manifest's), else ``params``'."""
    noise = domain_noise(params, DOMAIN) if binding is None else NoiseSource(TEST_KEY).for_domain(DOMAIN, binding)
    mech, rows = params.build_mechanism(), []
    for stream in ("a", "b"):
        els = [(ts, UNIVERSE.encode_one({"colour": c, "size": s})) for st, ts, c, s in elements if st == stream]
        qs = [(qid, t, UNIVERSE.predicate(p) if p else UNIVERSE.counting_query(i))
              for st, qid, t, p, i in queries if st == stream]
        releases, _ = replay_growing_database(params, stream, els, qs, noise)
        rows += [release_to_row(r, mech.guarantee) for r in releases]
    return labelled(rows, params, DOMAIN)


def _key(row):
    meta = row["meta"] if isinstance(row, dict) else json.loads(row.meta)
    stream, step = (row["stream"], row["step"]) if isinstance(row, dict) else (row.stream, row.step)
    return stream, step, str(meta.get("query_id"))


def _write(tmp_path, elements, queries):
    lines = ["stream_id,timestamp,colour,size"] + [f"{s},{t!r},{c},{z!r}" for s, t, c, z in elements]
    lines += ["a,5.0,purple,1.0", "a,6.0,red,11.0", "a,70.0,red,1.0", "a,7.0,red"]
    (tmp_path / "elements.csv").write_text("\n".join(lines) + "\n")
    qlines = ["stream_id,query_id,t,predicate,indices"]
    for s, qid, t, p, i in queries:
        qlines.append(f"{s},{qid},{t},\"{json.dumps(p).replace(chr(34), chr(34) * 2)}\"," if p else
                      f"{s},{qid},{t},,\"{json.dumps(i)}\"")
    qlines += ["a,early,3,,\"[1]\"", "a,never,999,,\"[1]\"", "b,bad,20,\"{\"\"shape\"\": [1]}\","]
    (tmp_path / "queries.csv").write_text("\n".join(qlines) + "\n")


def test_help_lists_the_job_flags(capsys):
    assert job.main(["--help"]) == 0
    text = capsys.readouterr().out
    for flag in ("--input", "--queries", "--universe", "--mechanism", "--epsilon", "--start", "--period", "--end"):
        assert flag in text


def test_cli_on_two_files_equals_the_pure_mechanism_and_dead_letters_bad_rows(tmp_path, capsys):
    elements, queries = _data()
    _write(tmp_path, elements, queries)
    out = tmp_path / "out"
    argv = [f"--input={tmp_path / 'elements.csv'}", f"--queries={tmp_path / 'queries.csv'}", f"--output={out}",
            f"--universe={UNIVERSE_JSON}", "--n=10", "--epsilon=1.0", "--delta=1e-6", "--mechanism=bbimprover",
            "--start=0", "--period=10", "--end=50"]
    assert job.main(argv) == 0
    assert "answers:" in capsys.readouterr().out
    params = GrowingDatabaseParams(universe=UNIVERSE, n=10, epsilon=1.0, delta=1e-6, mechanism="bbimprover",
                                   clock=StepClock(0, 10, 50))
    want = sorted(_expected(params, elements, queries, read_manifest(str(out)).transforms[0].noise_binding), key=_key)
    got = sorted(read_releases(str(out / "answers-*")), key=_key)
    assert [_key(r) for r in got] == [_key(r._asdict() | {"meta": json.loads(r.meta)}) for r in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g["value"], w.value, rtol=1e-12, atol=1e-12)
        assert g["epsilon_spent"] == w.epsilon_spent <= 1.0
        assert (g["noise_domain"], g["composition"], g["job_epsilon_spent"]) == (
            w.noise_domain, w.composition, w.job_epsilon_spent)
    assert dead_letters(out) == {"answers:outside_universe": 2, "answers:after_end": 2, "answers:malformed": 1, "read:malformed": 1,
                                 "answers:before_start": 1}


@pytest.mark.parametrize("argv, fix", [
    (["--bogus=1"], "unknown flag --bogus"),
    (["--input=x.csv"], "--universe is required"),
    (["--input=x.csv", f"--universe={UNIVERSE_JSON}", "--start=0", "--period=1"], "--end"),
    (["--input=/no/such.csv", "--queries=/no/q.csv", f"--universe={UNIVERSE_JSON}", "--start=0", "--period=1",
      "--end=9"], "no files match --input"),
    (["--universe={\"a\": 3}"], "--universe"),
    (["--mechanism=bbimprover"], "bbimprover"),
])
def test_usage_errors_are_one_line_with_exit_code_2(argv, fix, capsys, tmp_path):
    assert_usage_error(job.main, PROG, argv + [f"--output={tmp_path}"], fix, capsys)
