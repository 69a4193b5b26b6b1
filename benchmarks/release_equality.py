"""Release equality: every job's releases under one fixed noise key equal those of a base commit. Run by hand
(not a test), from any folder:

    python benchmarks/release_equality.py --base 43c4e41 [--jobs cs_default,ll_l2dp] [--workers 2] [--keep]

``--base`` names the commit to compare with (e.g. ``43c4e41``, the tree before the mechanism families moved into
their folders). The script adds a temporary ``git worktree`` of it in a temporary folder (removed at the end; the
caller's index and work tree are not touched), writes the demo inputs once (``python -m pipelines.demo_data``
of this tree) and a fixed hex noise key, and runs every job of :data:`JOBS` twice: with the base tree (cwd and
``PYTHONPATH`` the worktree) and with this tree, on the same inputs, key and flags. :data:`JOBS` holds the six
commands (``continual_stats``, ``model_release``, ``growing_db_queries``, ``online_learning``, ``lifelong`` on
tiny CPU settings, ``run_yaml``) with their main variants. It reads both runs' release files (Parquet or JSON
lines, grouped by file prefix: ``sum``, ``count``, ``models``, ...) and the manifest, matches rows by their
identity columns (:data:`IDENTITY`), and compares every column: numbers and number lists within
``--tolerance`` (1e-12, relative for values above 1 in magnitude), JSON text (``meta``, ``noise``) and the
manifest leaf by leaf (numeric leaves as numbers, the others exactly), everything else exactly; the schemas
(dictionary encoding aside) must be equal. It then runs this tree's verifier (``python -m beam_dp.verify``) on each of the base tree's
output folders: outputs written by the base still verify. Prints one table row per job and file prefix and
exits 1 on any FAIL (a job that does not run in either tree is a FAIL too).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
KEY = "5eed" * 16  # a fixed test key (64 hex digits); never a real one
MANIFEST = "_beam_dp_manifest.json"

#: columns that identify a release row (those a file has, in this order); repeats of one identity are told
#: apart by their order in the file
IDENTITY = ("stream", "step", "mechanism", "window", "task_id", "query_id", "kind", "t")

_LIFELONG = ["--input", "{data}/tasks.csv", "--eval-input", "{data}/eval.csv", "--tasks", "0,1,2",
             "--classes", "0,1,2,3,4,5,6,7,8,9", "--task-size", "479", "--steps-per-task", "3", "--hidden", "8",
             "--g-layers", "8", "--batch-size", "32", "--memory-uses", "4", "--device", "cpu", "--torch-threads", "1"]
_EVENTS = ["--input", "{data}/events/*.parquet", "--start", "1767225600", "--period", "3600", "--end", "1768435200"]
_UNIVERSE = ["--input", "{data}/elements.csv", "--queries", "{data}/queries.csv", "--universe",
             '{"colour": ["red", "green", "blue", "grey"], "size": {"edges": [0, 1, 2, 5, 10]}}',
             "--start", "0", "--period", "10", "--end", "100"]


@dataclass(frozen=True)
class Job:
    """One command: ``python -m module *args`` in ``cwd`` (relative to the tree); ``{data}``, ``{out}`` and
    ``{key}`` in the arguments are the input folder, the output folder and the key file."""

    name: str
    module: str
    args: tuple[str, ...]
    cwd: str = "."


def _job(name: str, module: str, *args: str) -> Job:
    return Job(name, module, (*args, "--noise-key-file", "{key}", "--output", "{out}"))


def _yaml(name: str, template: str, **variables) -> Job:
    variables = dict(variables, output="{out}", noise_key_file="{key}")
    return Job(name, "pipelines.run_yaml", (f"--yaml_pipeline_file={template}",
                                            "--jinja_variables=" + json.dumps(variables)), cwd="templates/yaml")


JOBS = (
    _job("cs_default", "pipelines.continual_stats"),  # the embedded demo dataset: sum and windowed sum
    _job("cs_pure_window_count", "pipelines.continual_stats", *_EVENTS, "--window", "24", "--count"),
    _job("cs_gaussian_blt", "pipelines.continual_stats", *_EVENTS, "--noise", "gaussian", "--delta", "1e-6",
         "--window", "24", "--count", "--blt-error", "mean"),
    _job("cs_tree_by_stream_jsonl", "pipelines.continual_stats", *_EVENTS, "--counter", "tree",
         "--stream-groups", "0", "--format", "jsonl"),
    _job("cs_honaker_granularity", "pipelines.continual_stats", *_EVENTS, "--counter", "honaker", "--horizon", "336",
         "--granularity", "0.01", "--noise", "gaussian", "--delta", "1e-6", "--calibration", "paper"),
    _job("mr_continual", "pipelines.model_release", "--input", "{data}/train.csv", "--classes", "0,1,2"),
    _job("mr_multires_gauss", "pipelines.model_release", "--input", "{data}/train.csv", "--classes", "0,1,2",
         "--algorithm", "multiresolution", "--noise", "gaussian", "--delta", "1e-6"),
    _job("mr_sliding", "pipelines.model_release", "--input", "{data}/train.csv", "--classes", "0,1,2",
         "--algorithm", "sliding", "--block-size", "64", "--window", "448"),
    _job("gdb_pmwg", "pipelines.growing_db_queries", *_UNIVERSE, "--mechanism", "pmwg", "--snapshots", "true"),
    _job("gdb_bbscheduler", "pipelines.growing_db_queries", *_UNIVERSE, "--mechanism", "bbscheduler"),
    _job("gdb_bbimprover", "pipelines.growing_db_queries", *_UNIVERSE, "--mechanism", "bbimprover",
         "--delta", "1e-6"),
    _job("ol_cocop", "pipelines.online_learning", "--input", "{data}/r.csv"),
    _job("ol_cocol_l1", "pipelines.online_learning", "--input", "{data}/r.csv", "--algorithm", "cocol",
         "--constraint", "l1_ball", "--window", "64"),
    _job("ol_regression", "pipelines.online_learning", "--learner", "regression", "--input", "{data}/r.csv",
         "--start", "0", "--period", "10", "--end", "60", "--delta", "1e-6"),
    _job("ol_privincreg2", "pipelines.online_learning", "--learner", "regression", "--algorithm", "privincreg2",
         "--input", "{data}/r.csv", "--block-size", "32", "--horizon", "18", "--delta", "1e-6"),
    _job("ol_privincerm", "pipelines.online_learning", "--learner", "regression", "--algorithm", "privincerm",
         "--input", "{data}/r.csv", "--block-size", "64", "--horizon", "9", "--iterations", "20", "--delta", "1e-6"),
    _job("ll_bounded_agem", "pipelines.lifelong", *_LIFELONG),
    _job("ll_naive_gaussian", "pipelines.lifelong", *_LIFELONG, "--learner", "naive_gaussian"),
    _job("ll_l2dp", "pipelines.lifelong", *_LIFELONG, "--learner", "l2dp"),
    _yaml("yaml_continual_sum", "continual_sum.yaml", input="{data}/events.csv", start=0, period=10, end=40),
    _yaml("yaml_model_release", "model_release.yaml", input="{data}/train.csv", dim=64, classes=[0, 1, 2],
          update_size=64, base_size=256),
)


@dataclass
class Run:
    """One job run in one tree."""

    rc: int
    seconds: float
    tail: str
    out: Path


@dataclass
class Comparison:
    """One file prefix of one job: base against current."""

    rows: tuple[int, int]
    matched: int = 0
    schema_equal: bool = True
    max_diff: dict[str, float] = field(default_factory=dict)  # numeric column (or meta leaf) -> max abs diff
    exact: set[str] = field(default_factory=set)  # the other columns (or leaves), compared exactly
    mismatches: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # column -> rows that differ
    problems: list[str] = field(default_factory=list)
    added: set[str] = field(default_factory=set)  # meta/noise leaves only the current rows declare


def run_job(job: Job, tree: Path, data: Path, key: Path, out: Path, timeout: float) -> Run:
    """Run ``job`` with ``tree`` first on the path; its releases under ``out``."""
    args = [a.replace("{data}", str(data)).replace("{out}", str(out)).replace("{key}", str(key)) for a in job.args]
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("BEAM_DP_NOISE_KEY", None)
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", job.module, *args], cwd=tree / job.cwd, env=env,
                              capture_output=True, text=True, timeout=timeout)
        rc, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        rc, text = 124, f"timed out after {timeout:.0f} s"
    return Run(rc, time.monotonic() - start, "\n".join(text.strip().splitlines()[-3:]), out)


def _prefix(name: str) -> str:
    match = re.match(r"(.*?)-\d{5}-of-\d{5}", name)
    return match.group(1) if match else name.split(".")[0]


def read_outputs(folder: Path) -> dict[str, tuple[pa.Schema | None, list[dict]]]:
    """The release files under ``folder`` by file prefix: (schema, rows); JSON lines have no schema. The
    job's manifest is one more group (``manifest``: one row, no schema)."""
    manifest = folder / MANIFEST
    groups: dict[str, tuple[pa.Schema | None, list[dict]]] = {
        "manifest": (None, [json.loads(manifest.read_text())])} if manifest.is_file() else {}
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or path.name.startswith(("_", ".")) or path.suffix not in (".parquet", ".jsonl"):
            continue
        if path.suffix == ".parquet":
            table = pq.read_table(path)
            table = pa.table({name: pa.chunked_array([c.dictionary_decode() for c in col.chunks], col.type.value_type)
                              if pa.types.is_dictionary(col.type) else col
                              for name, col in zip(table.column_names, table.columns)})
            schema, rows = table.schema, table.to_pylist()
        else:
            schema, rows = None, [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        old_schema, old_rows = groups.get(_prefix(path.name), (schema, []))
        if old_schema is not None and schema is not None and not old_schema.equals(schema):
            schema = old_schema  # shards of one prefix share a schema; a difference shows as unmatched columns
        groups[_prefix(path.name)] = (schema, old_rows + rows)
    return groups


def _keyed(rows: list[dict]) -> dict[tuple, dict]:
    keyed: dict[tuple, dict] = {}
    seen: dict[tuple, int] = defaultdict(int)
    for row in rows:
        ident = tuple(json.dumps(row.get(c), sort_keys=True) for c in IDENTITY if c in row)
        keyed[(*ident, seen[ident])] = row
        seen[ident] += 1
    return keyed


def _leaves(value, path: str, out: dict) -> None:
    """Flatten dicts (and lists holding dicts) into ``out`` by dotted path; other values are leaves."""
    if isinstance(value, dict):
        for k, v in value.items():
            _leaves(v, f"{path}.{k}", out)
    elif isinstance(value, list) and any(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):
            _leaves(v, f"{path}.{i}", out)
    else:
        out[path] = value


def _cells(column: str, value) -> dict:
    """A cell as ``{name: leaf}``: a JSON object in text (``meta``) leaf by leaf, anything else as itself."""
    if isinstance(value, str) and value.startswith("{"):
        try:
            value = json.loads(value)
        except ValueError:
            return {column: value}
    out: dict = {}
    _leaves(value, column, out)
    return out


def _numbers(value) -> list[float] | None:
    """``value`` as a flat list of floats when it is a number or a (nested) list of numbers, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, list):
        flat: list[float] = []
        for item in value:
            numbers = _numbers(item)
            if numbers is None:
                return None
            flat.extend(numbers)
        return flat
    return None


def _diff(a: float, b: float, tolerance: float) -> tuple[float, bool]:
    """(abs difference, within tolerance: relative above 1 in magnitude); equal infinities and NaNs agree."""
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0, True
    d = abs(a - b)
    return d, d <= tolerance * max(1.0, abs(a), abs(b))


def compare(base: tuple[pa.Schema | None, list[dict]], current: tuple[pa.Schema | None, list[dict]],
            tolerance: float) -> Comparison:
    """Match the two row sets by identity and compare every column (module docstring)."""
    (schema_a, rows_a), (schema_b, rows_b) = base, current
    result = Comparison(rows=(len(rows_a), len(rows_b)))
    if schema_a is not None and schema_b is not None and not schema_a.remove_metadata().equals(
            schema_b.remove_metadata()):
        result.schema_equal = False
        fields_a, fields_b = ({f"{f.name}: {f.type}" for f in schema} for schema in (schema_a, schema_b))
        result.problems.append(f"schema: base only {sorted(fields_a - fields_b)}, current only "
                               f"{sorted(fields_b - fields_a)} (or the same fields in another order)")
    a, b = _keyed(rows_a), _keyed(rows_b)
    only = sorted(set(a) ^ set(b))
    if only:
        result.problems.append(f"{len(only)} rows in one run only, e.g. {only[0]}")
    for ident in a.keys() & b.keys():
        result.matched += 1
        cells_a: dict = {}
        cells_b: dict = {}
        for column in a[ident].keys() | b[ident].keys():
            cells_a.update(_cells(column, a[ident].get(column)))
            cells_b.update(_cells(column, b[ident].get(column)))
        for name in cells_a.keys() | cells_b.keys():
            if name not in cells_a and name.startswith(("meta.", "noise.")):
                result.added.add(name)  # a declaration the base did not write: not a change of any release
                continue
            x, y = cells_a.get(name), cells_b.get(name)
            nx, ny = _numbers(x), _numbers(y)
            if nx is not None and ny is not None and len(nx) == len(ny):
                worst, agree = 0.0, True
                for u, v in zip(nx, ny):
                    d, ok = _diff(u, v, tolerance)
                    worst, agree = max(worst, d), agree and ok
                result.max_diff[name] = max(result.max_diff.get(name, 0.0), worst)
                if not agree:
                    result.mismatches[name] += 1
            else:
                result.exact.add(name)
                result.mismatches[name] += x != y
    return result


def verify(tree: Path, folder: Path, timeout: float) -> tuple[int, str]:
    """This tree's verifier on ``folder``: (exit code, last line)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    try:
        done = subprocess.run([sys.executable, "-m", "beam_dp.verify", str(folder)], cwd=tree, env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, "timed out"
    lines = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode, lines[-1] if lines else ""


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare with, e.g. 43c4e41")
    parser.add_argument("--jobs", help="comma-separated job names (default: all): " + ", ".join(j.name for j in JOBS))
    parser.add_argument("--tolerance", type=float, default=1e-12, help="abs, or relative above 1 (default 1e-12)")
    parser.add_argument("--workers", type=int, default=2, help="job runs at once (default 2)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per job run (default 300)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (its path is printed)")
    parser.add_argument("--verbose", action="store_true", help="name the columns compared as values, not numbers")
    opts = parser.parse_args(argv)
    jobs = JOBS if not opts.jobs else tuple(j for j in JOBS if j.name in opts.jobs.split(","))
    unknown = set((opts.jobs or "").split(",")) - {j.name for j in JOBS} - {""}
    if unknown:
        parser.error(f"unknown jobs: {', '.join(sorted(unknown))}")
    base_commit = _git("rev-parse", "--verify", f"{opts.base}^{{commit}}")
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="release_equality-"))
    worktree = tmp / "worktree"
    try:
        _git("worktree", "add", "--detach", str(worktree), base_commit)
        data, key = tmp / "data", tmp / "noise.key"
        key.write_text(KEY + "\n")
        subprocess.run([sys.executable, "-m", "pipelines.demo_data", "--out", str(data)], cwd=ROOT, check=True,
                       capture_output=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        trees = {"base": worktree, "current": ROOT}
        with ThreadPoolExecutor(max(1, opts.workers)) as pool:
            futures = {(job.name, side): pool.submit(run_job, job, tree, data, key, tmp / side / job.name,
                                                     opts.timeout)
                       for job in jobs for side, tree in trees.items()}
            runs = {k: f.result() for k, f in futures.items()}
        print(f"release equality: {base_commit[:10]} (base) vs {ROOT} (current), key fixed, tolerance "
              f"{opts.tolerance:g}")
        print(f"{'job':<26}{'file':<11}{'rows':>13}{'schema':>8}  {'max abs diff':>12}  {'result':<6} worst column")
        failed = 0
        for job in jobs:
            base_run, current_run = runs[(job.name, "base")], runs[(job.name, "current")]
            if base_run.rc or current_run.rc:
                failed += 1
                print(f"{job.name:<26}{'-':<11}{'-':>13}{'-':>8}  {'-':>12}  FAIL   exit base {base_run.rc}, "
                      f"current {current_run.rc}")
                for side, run in (("base", base_run), ("current", current_run)):
                    if run.rc:
                        print(f"    {side}: {run.tail}")
                continue
            base_out, current_out = read_outputs(base_run.out), read_outputs(current_run.out)
            if not base_out:
                failed += 1
                print(f"{job.name:<26}FAIL: no release files")
            for prefix in sorted(base_out.keys() | current_out.keys()):
                if prefix not in base_out or prefix not in current_out:
                    failed += 1
                    print(f"{job.name:<26}{prefix:<11}FAIL: files only in the "
                          f"{'current' if prefix in current_out else 'base'} run")
                    continue
                c = compare(base_out[prefix], current_out[prefix], opts.tolerance)
                ok = c.schema_equal and not any(c.mismatches.values()) and not c.problems and c.rows[0] == c.rows[1]
                failed += not ok
                worst = max(c.max_diff.items(), key=lambda kv: kv[1], default=("-", 0.0))
                worst = worst if worst[1] > 0 else ("-", 0.0)
                rows = f"{c.rows[0]}/{c.rows[1]}"
                print(f"{job.name:<26}{prefix:<11}{rows:>13}{'equal' if c.schema_equal else 'DIFF':>8}  "
                      f"{worst[1]:>12.3g}  {'PASS' if ok else 'FAIL':<6} {worst[0]}")
                exact = sorted(c.exact - c.max_diff.keys())
                print("    max abs diff: " + ", ".join(f"{name} {d:.3g}" for name, d in sorted(c.max_diff.items())) +
                      f"; equal as values: {', '.join(exact) if opts.verbose else f'{len(exact)} more'}")
                for name, n in sorted(c.mismatches.items()):
                    if n:
                        print(f"    differs: {name} in {n} of {c.matched} rows")
                if c.added:
                    print(f"    declared by the current rows only: {', '.join(sorted(c.added))}")
                for problem in c.problems:
                    print(f"    {problem}")
        print(f"\nthis tree's verifier on the base outputs ({ROOT / 'beam_dp' / 'verify.py'}):")
        for job in jobs:
            run = runs[(job.name, "base")]
            if run.rc:
                continue
            rc, line = verify(ROOT, run.out, opts.timeout)
            failed += rc != 0
            print(f"  {job.name:<26}{'PASS' if rc == 0 else f'FAIL (exit {rc})':<16}{line}")
        seconds = {side: sum(r.seconds for (_, s), r in runs.items() if s == side) for side in trees}
        cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(f"\n{len(jobs)} jobs; wall of the job runs {seconds['base']:.0f} s base, {seconds['current']:.0f} s "
              f"current; {time.monotonic() - started:.0f} s wall and {cpu.ru_utime + cpu.ru_stime:.0f} s CPU in all; "
              f"{failed} FAIL")
        return 1 if failed else 0
    finally:
        if (worktree / ".git").exists():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                           capture_output=True)
        if opts.keep:
            print(f"kept {tmp} (the worktree removed)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
