"""Fuzz campaign over every job's flags and input files (issue 25): random flag sets (valid, extreme
and junk values; for ``pipelines.run_yaml`` random Jinja variables of ``continual_sum.yaml``), random
input files (good, mixed-width globs, BOM, repeated columns, empty, folders; the good ones as pyarrow and
the csv module's QUOTE_ALL write them, or with a line over the reader's bound), random key files and
output locations (fresh, a previous output, a file, a foreign folder, a folder in use, object stores
without their extra).

Three kinds of case:

* ``launch`` (the bulk, in this process): ``main(argv)`` of ``pipelines.<job>`` up to the point where
  the pipeline would be built (``pipelines.runner.run`` is replaced by a stop; for ``run_yaml``, a
  fiftieth of the cases as each builds the pipeline once to plan it, ``_build_and_run``): every case
  must end as "would run" or one line ``<prog>: error: ...`` with exit 2, within a few seconds, and
  leave a previous output byte for byte, with no staging folder or lock left behind;
* ``full``: a real run in a subprocess: exit 0, or one line and exit 2; never a traceback;
* ``interrupted``: a real run sent SIGINT, SIGTERM or SIGHUP after a random delay: exit 0, 2 or
  130 / 143 / 129 (one line); the previous output is either untouched or replaced by a complete new one.

    python -m tests.reliability.fuzz_jobs --launch 20000 --full 6 --interrupted 6 --seed 1

prints the number of cases of each kind and their outcomes; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import io
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JOBS = ("continual_stats", "model_release", "growing_db_queries", "online_learning", "lifelong")
YAML = "run_yaml"  # python -m pipelines.run_yaml with the continual_sum template
YAML_SHARE = 0.02  # of the launch cases (each plans the pipeline: about a second of CPU, 7 s on a loaded machine)
YAML_TEMPLATE = ROOT / "templates" / "yaml" / "continual_sum.yaml"
KEY_HEX = "5f" * 32
CASE_SECONDS = 60  # a launch case slower than this is a hang (a loaded shared machine: generous)


class _WouldRun(BaseException):
    """Raised instead of building and running the pipeline: the flags passed every launch check."""


class _Hang(BaseException):
    """Raised by the per-case deadline (a BaseException: the jobs' one-line handling must not catch it)."""


@dataclass
class Tally:
    kinds: Counter = field(default_factory=Counter)
    outcomes: Counter = field(default_factory=Counter)
    failures: list = field(default_factory=list)

    def fail(self, kind: str, argv: list[str], why: str) -> None:
        self.failures.append((kind, argv, why[-600:]))


# -- the material: files, keys, outputs ------------------------------------------------------------
def make_world(root: Path) -> dict[str, list[str]]:
    """Input files, key files and output locations the cases draw from (paths as text)."""
    root.mkdir(parents=True, exist_ok=True)
    w = root / "in"
    w.mkdir(exist_ok=True)
    events = "stream_id,timestamp,value\n" + "".join(f"s{i % 3},{i * 1.7:.1f},{(-1) ** i * 0.3}\n" for i in range(40))
    (w / "events.csv").write_text(events)
    (w / "events_bom.csv").write_bytes(b"\xef\xbb\xbf" + events.encode())
    (w / "events_dup.csv").write_text("stream_id,timestamp,value,value\ns,1,0.5,0.5\n")
    (w / "wide").mkdir(exist_ok=True)
    (w / "wide" / "a.csv").write_text(events)
    (w / "wide" / "b.csv").write_text("stream_id,timestamp,value_0,value_1\n" + "s,1,0.5,0.5\n" * 50)
    (w / "empty.csv").write_text("")
    (w / "junk.csv").write_bytes(bytes(range(256)) * 4)
    xy = "stream_id,x_0,x_1,label\n" + "".join(f"s,{0.1 * i:.2f},{-0.03 * i:.2f},{i % 2}\n" for i in range(40))
    (w / "examples.csv").write_text(xy)
    (w / "tasks.csv").write_text("stream_id,task_id,x_0,x_1,label\n" + "".join(
        f"s,{t},{0.1 * i:.2f},0.5,{i % 2}\n" for t in (0, 1) for i in range(40)))
    (w / "elements.csv").write_text("stream_id,timestamp,color\n" + "".join(f"s,{i},red\n" for i in range(1, 40)))
    (w / "queries.csv").write_text('stream_id,query_id,t,predicate,indices\ns,q,2,,"[0]"\n')
    _real_writers(w, events, xy)
    (w / "folder").mkdir(exist_ok=True)
    keys = root / "keys"
    keys.mkdir(exist_ok=True)
    (keys / "good.key").write_text(KEY_HEX)
    (keys / "empty.key").write_text("")
    (keys / "short.key").write_bytes(b"abc")
    (keys / "dir.key").mkdir(exist_ok=True)
    inputs = [str(w / n) for n in ("events.csv", "events_bom.csv", "events_dup.csv", "empty.csv", "junk.csv",
                                   "examples.csv", "tasks.csv", "elements.csv", "queries.csv", "folder",
                                   "missing.csv", *(v for vs in VARIANTS.values() for v in vs))
              ] + [str(w / "wide" / "*.csv"), str(w / "*.csv")]
    return {"input": inputs, "key": [str(keys / n) for n in ("good.key", "empty.key", "short.key", "dir.key",
                                                             "missing.key")]}


#: the good inputs a real run reads, and the same rows as common writers write them (quoted headers and
#: fields, CRLF, a byte-order mark) or with one line over the reader's bound among them
VARIANTS = {"events.csv": ("events_pyarrow.csv", "events_long.csv"),
            "examples.csv": ("examples_quoted.csv", "examples_long.csv"),
            "tasks.csv": ("tasks_quoted.csv",), "elements.csv": ("elements_pyarrow.csv",)}
LONG_LINE = 9 << 20  # bytes: over beam_dp.io.tables.MAX_LINE_BYTES


def _real_writers(w: Path, events: str, xy: str) -> None:
    """The :data:`VARIANTS` files: pyarrow's ``write_csv``, the csv module's QUOTE_ALL (CRLF; a BOM for
    the tasks), and a line of ``LONG_LINE`` bytes in the middle of a plain file."""
    import csv

    import pyarrow as pa
    import pyarrow.csv as pacsv

    def rows(text: str) -> tuple[list[str], list[list[str]]]:
        lines = [line.split(",") for line in text.splitlines()]
        return lines[0], lines[1:]

    def quoted(name: str, text: str, bom: bool = False) -> None:
        with open(w / name, "w", newline="", encoding="utf-8-sig" if bom else "utf-8") as fh:
            csv.writer(fh, quoting=csv.QUOTE_ALL).writerows([rows(text)[0], *rows(text)[1]])

    def arrow(name: str, text: str) -> None:
        header, body = rows(text)
        pacsv.write_csv(pa.table({h: [r[j] for r in body] for j, h in enumerate(header)}), str(w / name))

    def long(name: str, text: str) -> None:
        lines = text.splitlines(keepends=True)
        fields = lines[1].rstrip("\n").split(",")
        fields[-2] += "9" * LONG_LINE  # a number column grown past the bound
        (w / name).write_text("".join(lines[:10] + [",".join(fields) + "\n"] + lines[10:]))

    arrow("events_pyarrow.csv", events)
    long("events_long.csv", events)
    quoted("examples_quoted.csv", xy)
    long("examples_long.csv", xy)
    quoted("tasks_quoted.csv", (w / "tasks.csv").read_text(), bom=True)
    arrow("elements_pyarrow.csv", (w / "elements.csv").read_text())


def previous_output(folder: Path) -> dict[str, str]:
    """A complete earlier run's folders (as a job leaves them), and their file hashes."""
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(f"{folder}.private", ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "sum-00000-of-00001.parquet").write_bytes(b"PAR1 previous releases PAR1")
    private = Path(f"{folder}.private")
    private.mkdir()
    (private / "dead_letter-00000-of-00001.jsonl").write_text('{"reason": "malformed"}\n')
    return tree(folder) | tree(private)


def tree(folder: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def leftovers(root: Path) -> list[str]:
    return [p.name for p in root.iterdir() if ".staging-" in p.name or p.name.endswith(".lock")
            or ".previous-" in p.name]


# -- random flags -----------------------------------------------------------------------------------
FLOATS = ("0", "-1", "1", "0.5", "2", "1e-6", "1e20", "-1e20", "nan", "inf", "abc", "", "1e400", "3600", "10")
INTS = ("0", "1", "2", "4", "16", "64", "-3", "1.5", "abc", "99999999999999999999", "")
LISTS = ("a,b", "0,1", "0,1,2", ",", "", "s", "s0,s1,s2", "a,,b")
STRS = ("", "x", "\udcff", "{}", '{"color": ["red", "blue"]}', '{"color": {"range": 3}}', "[1]", "BAD_ENV",
        "projects/p/secrets/s/versions/1", "projects/p/secrets/s")


def random_argv(rng: random.Random, job: str, world: dict, out: str) -> list[str]:
    from pipelines import spec

    params = [p for p in spec.JOBS[job] if p.cli and p.name not in ("output", "source", "verbose")]
    argv = [f"--output={out}"]
    for p in rng.sample(params, rng.randint(0, min(8, len(params)))):
        if p.name in ("input", "queries", "eval_input"):
            value = rng.choice(world["input"])
        elif p.name == "noise_key_file":
            value = rng.choice(world["key"])
        elif p.name == "dead_letter_output":
            value = rng.choice([out, out + ".raw", "/proc/forbidden/x", "s3://b/raw"])
        elif p.choices:
            value = rng.choice(list(map(str, p.choices)) + ["bogus"])
        elif p.kind == "float":
            value = rng.choice(FLOATS)
        elif p.kind == "int":
            value = rng.choice(INTS)
        elif p.kind == "bool":
            value = rng.choice(("true", "false", "maybe", None))
        elif p.kind == "list":
            value = rng.choice(LISTS)
        else:
            value = rng.choice(STRS)
        flag = rng.choice(p.flags)
        argv.append(flag if value is None else f"{flag}={value}")
    if rng.random() < 0.05:
        argv.append(rng.choice(["--bogus=1", "positional", "--streaming=maybe", "--runner=NoSuchRunner"]))
    rng.shuffle(argv)
    return argv


def yaml_argv(rng: random.Random, world: dict, out: str, most: int = 4) -> list[str]:
    """``run_yaml``'s flags: the continual_sum template with up to ``most`` of its Jinja variables
    random (valid, extreme, junk, missing) and now and then a junk flag."""
    folder = str(Path(world["input"][0]).parent)
    variables: dict = {"input": f"{folder}/events.csv", "output": out, "start": 0, "period": 10, "end": 80}
    choices = {"input": world["input"], "noise_key_file": world["key"], "dim": INTS,
               "dead_letter_output": [out, out + ".raw", "/proc/forbidden/x", "s3://b/raw", ""],
               **{name: FLOATS for name in ("epsilon", "clip_bound", "start", "period", "end")}}
    for name in rng.sample(sorted(choices), rng.randint(0, most)):
        if rng.random() < 0.1:
            variables.pop(name, None)
        else:
            variables[name] = rng.choice(list(choices[name]))
    argv = [f"--yaml_pipeline_file={YAML_TEMPLATE}", f"--jinja_variables={json.dumps(variables)}"]
    if rng.random() < 0.05:
        argv.append(rng.choice(["--bogus=1", "positional", "--jinja_variables={", "--runner=NoSuchRunner"]))
    return argv


def job_argv(rng: random.Random, job: str, world: dict, out: str) -> list[str]:
    return yaml_argv(rng, world, out) if job == YAML else random_argv(rng, job, world, out)


# -- the three kinds of case -------------------------------------------------------------------------
@contextlib.contextmanager
def _deadline(seconds: int):
    def alarm(*_):
        raise _Hang(f"no answer in {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def launch_cases(n: int, seed: int, root: Path, tally: Tally) -> None:
    import pipelines.run_yaml
    import pipelines.runner

    world = make_world(root)
    mains = {job: importlib.import_module(f"pipelines.{job}").main for job in JOBS + (YAML,)}

    def stop(*args, **kwargs):
        raise _WouldRun()

    real_run, pipelines.runner.run = pipelines.runner.run, stop
    real_yaml_run, pipelines.run_yaml._build_and_run = pipelines.run_yaml._build_and_run, stop
    real_key, os.environ["BEAM_DP_NOISE_KEY"] = os.environ.get("BEAM_DP_NOISE_KEY"), KEY_HEX
    rng = random.Random(seed)
    prev = root / "prev"
    try:
        for job in JOBS:  # warm-up, not counted: the first call of each job pays its imports (seconds)
            _one_launch(mains[job], job, [f"--output={root / 'warm'}", "--output=s3://b/x"], Tally(), 600)
        _one_launch(mains[YAML], YAML, yaml_argv(random.Random(0), world, "s3://b/x"), Tally(), 600)
        for i in range(n):
            job = YAML if rng.random() < YAML_SHARE else rng.choice(JOBS)
            kind = rng.choice(["fresh", "prev", "prev", "file", "foreign", "locked", "gs", "s3"])
            want = previous_output(prev) if kind in ("prev", "locked") else None
            out = {"fresh": str(root / f"new{i % 7}"), "prev": str(prev), "locked": str(prev),
                   "file": str(root / "in" / "events.csv"), "foreign": str(root / "in"),
                   "gs": "gs://bucket/out", "s3": "s3://bucket/out"}[kind]
            if kind == "locked":
                Path(str(prev) + ".lock").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
            argv = job_argv(rng, job, world, out)
            _one_launch(mains[job], job, argv, tally)
            if kind == "locked":
                os.remove(str(prev) + ".lock")
            if want is not None and tree(prev) | tree(Path(f"{prev}.private")) != want:
                tally.fail("launch", argv, "the previous output changed")
            if leftovers(root):
                tally.fail("launch", argv, f"left behind: {leftovers(root)}")
                for name in leftovers(root):
                    target = root / name
                    shutil.rmtree(target) if target.is_dir() else target.unlink()
            if kind == "fresh":
                for folder in (Path(out), Path(out + ".private"), Path(out + ".raw")):
                    shutil.rmtree(folder, ignore_errors=True)
            tally.kinds["launch"] += 1
            tally.kinds[f"launch {job}"] += 1
    finally:
        pipelines.runner.run = real_run
        pipelines.run_yaml._build_and_run = real_yaml_run
        if real_key is None:
            del os.environ["BEAM_DP_NOISE_KEY"]
        else:
            os.environ["BEAM_DP_NOISE_KEY"] = real_key


def _one_launch(main, job: str, argv: list[str], tally: Tally, seconds: int = CASE_SECONDS) -> None:
    prog = f"python -m pipelines.{job}"
    err = io.StringIO()
    try:
        with _deadline(seconds), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            main(argv)
        tally.outcomes["returned"] += 1
    except _WouldRun:
        tally.outcomes["would run"] += 1
    except _Hang as exc:
        tally.fail("launch", argv, f"hang: {exc}")
    except SystemExit as exc:
        lines = err.getvalue().strip().splitlines()
        if exc.code == 2 and len(lines) == 1 and lines[0].startswith(f"{prog}: error:"):
            tally.outcomes["usage error"] += 1
        else:
            tally.fail("launch", argv, f"exit {exc.code}: {err.getvalue()}")
    except BaseException as exc:  # a traceback
        tally.fail("launch", argv, f"{type(exc).__name__}: {exc}")


FULL = {  # small real runs (flags known to start; the fuzz adds one random flag)
    "continual_stats": ["--input={in}/events.csv", "--start=0", "--period=10", "--end=80"],
    "model_release": ["--input={in}/examples.csv", "--classes=0,1", "--update-size=4", "--base-size=8"],
    "online_learning": ["--input={in}/examples.csv", "--window=4"],
    "growing_db_queries": ["--input={in}/elements.csv", "--queries={in}/queries.csv",
                           '--universe={{"color": ["red", "blue"]}}', "--n=5", "--start=0", "--period=10", "--end=40"],
    "lifelong": ["--input={in}/tasks.csv", "--tasks=0,1", "--classes=0,1", "--steps-per-task=1", "--task-size=8", "--device=cpu",
                 "--torch-threads=1"],
    YAML: [],  # yaml_argv
}


def _process(job: str, argv: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), BEAM_DP_NOISE_KEY=KEY_HEX)
    return subprocess.Popen([sys.executable, "-m", f"pipelines.{job}", *argv], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)


def _default_sigint() -> None:
    """A campaign started in the background (``nohup ... &``) ignores SIGINT, and so would its runs,
    which then never see the interrupt: each run gets Python's default Ctrl-C back."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _variant(rng: random.Random, arg: str) -> str:
    """``--input=<dir>/<good file>`` as one of its :data:`VARIANTS` (or itself), at random."""
    name = arg.rsplit("/", 1)[-1]
    if not arg.startswith("--input=") or name not in VARIANTS:
        return arg
    return arg[: -len(name)] + rng.choice((name, *VARIANTS[name]))


#: the interrupts a real run may get, and the exit code each must end with: Ctrl-C, a scheduler's or
#: container's stop, a closed terminal
INTERRUPTS = ((signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129))


def subprocess_cases(n_full: int, n_interrupted: int, seed: int, root: Path, tally: Tally) -> None:
    world = make_world(root)
    rng = random.Random(seed + 1)
    jobs = JOBS + (YAML,)
    for i in range(n_full + n_interrupted):
        interrupted = i >= n_full
        job = jobs[i % len(jobs)]
        prev = root / f"run{i}"
        want = previous_output(prev)
        if job == YAML:  # the template's good variables, one of them random
            argv = yaml_argv(rng, {**world, "input": [str(root / "in" / "events.csv")]}, str(prev), most=1)
        else:
            argv = [_variant(rng, a.format(**{"in": str(root / "in")})) for a in FULL[job]] + [f"--output={prev}"]
            extra = random_argv(rng, job, world, str(prev))
            argv += [a for a in extra if not a.startswith(("--output", "--input", "--queries", "--dead-letter"))][:1]
        tally.outcomes.update(f"input {a.rsplit('/', 1)[-1]}" for a in argv if a.startswith("--input="))
        proc = _process(job, argv)
        sig, code = rng.choice(INTERRUPTS) if interrupted else (signal.SIGINT, 130)
        if interrupted:
            time.sleep(rng.uniform(0.2, 8.0))
            proc.send_signal(sig)
            tally.outcomes[f"interrupted by {sig.name}"] += 1
        try:
            _, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            tally.fail("interrupted" if interrupted else "full", argv, "hang")
            continue
        kind = "interrupted" if interrupted else "full"
        tally.kinds[kind] += 1
        tally.outcomes[f"{kind} exit {proc.returncode}"] += 1
        lines = err.strip().splitlines()
        if interrupted and proc.returncode == -sig and len(lines) <= 1 and "Traceback" not in err:
            # ended by the signal itself (a shell shows exit 130): in interpreter start-up (no output)
            # or after its one line was printed, while the process was already exiting
            tally.outcomes["interrupted: ended by the signal"] += 1
        elif "Traceback" in err or proc.returncode not in ((0, 2, code) if interrupted else (0, 2)):
            tally.fail(kind, argv, f"exit {proc.returncode}: {err}")
        elif proc.returncode != 0 and len(lines) != 1:
            tally.fail(kind, argv, f"exit {proc.returncode} with {len(lines)} lines: {err}")
        now = tree(prev) | tree(Path(f"{prev}.private"))
        complete = (any("README_RAW_DATA" in p for p in now) and any("dead_letter-" in p for p in now)
                    and any(Path(p).name.split("-")[0] in ("sum", "models", "answers") for p in now)
                    and not set(want.values()) & set(now.values()))  # a whole new run, nothing of the old one
        if proc.returncode == 0 and not complete:
            tally.fail(kind, argv, "a successful run did not publish a complete new output")
        elif proc.returncode == -sig and now != want and not complete:
            tally.fail(kind, argv, "a run ended by the signal left a mix of outputs")
        elif proc.returncode not in (0, -sig) and now != want:
            tally.fail(kind, argv, "a failed run changed the previous output")
        elif proc.returncode == -sig and now != want:
            tally.outcomes["interrupted: ended by the signal after publishing"] += 1
        if leftovers(root):
            tally.fail(kind, argv, f"left behind: {leftovers(root)}")


def campaign(launch: int, full: int, interrupted: int, seed: int, root: Path | None = None) -> Tally:
    tally = Tally()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(root or tmp)
        launch_cases(launch, seed, base / "launch", tally)
        subprocess_cases(full, interrupted, seed, base / "runs", tally)
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.reliability.fuzz_jobs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--launch", type=int, default=2000)
    parser.add_argument("--full", type=int, default=5)
    parser.add_argument("--interrupted", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.monotonic()
    tally = campaign(args.launch, args.full, args.interrupted, args.seed)
    print(f"fuzz_jobs: {dict(tally.kinds)} cases in {time.monotonic() - start:.0f} s; outcomes "
          f"{dict(sorted(tally.outcomes.items()))}; {len(tally.failures)} failures")
    print(f"  failures by kind: {dict(Counter(kind for kind, _, _ in tally.failures))}")
    for kind, case, why in tally.failures[:20]:
        print(f"  {kind}: {case}\n    {why}")
    return 1 if tally.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
