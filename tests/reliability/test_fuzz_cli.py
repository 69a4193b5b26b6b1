"""CLI fuzz (issue 18): every job's numeric flags with extreme values, through ``main(argv)`` of the
``python -m pipelines.<job>`` entry points. Each case must end as a one-line ``<prog>: error: ...`` with
exit code 2, or pass validation (the pipeline would run: ``Pipeline.run`` is stubbed to stop there).
Any other exception (a traceback) fails. The number of cases is counted and printed (``-s``).
Every case uses the jobs' fixed demo data: it is made once per job and written again byte for byte
in later cases (``demo_made_once``), so the loop spends its time on the flag handling it checks."""

from __future__ import annotations

import importlib
import os

import apache_beam as beam
import pytest

VALUES = ("0", "-1", "1e20", "-1e20", "1e308", "1e400", "1e-320", "nan", "inf", "9223372036854775808", "abc", "",
          "1,2", "\udcff")
JOBS = {
    "continual_stats": ("--dim", "--epsilon", "--delta", "--clip-bound", "--start", "--period", "--end", "--horizon",
                        "--window", "--granularity"),
    "model_release": ("--dim", "--epsilon", "--delta", "--clip-bound", "--lam", "--huber", "--update-size", "--base-size",
                      "--block-size", "--window", "--max-level"),
    "growing_db_queries": ("--n", "--epsilon", "--delta", "--alpha", "--beta", "--gamma", "--start", "--period", "--end"),
    "online_learning": ("--dim", "--epsilon", "--delta", "--radius", "--mu", "--window", "--horizon", "--release-every",
                        "--block-size", "--start", "--period", "--end"),
    "lifelong": ("--dim", "--epsilon", "--delta", "--clip-norm", "--memory-uses", "--hidden", "--batch-size", "--epochs",
                 "--steps-per-task", "--learning-rate", "--torch-threads"),
}
COUNTS: dict[str, int] = {}


class _WouldRun(BaseException):
    """Raised instead of running a pipeline: the flags passed validation (a BaseException, so the
    jobs' one-line handling of unexpected failures does not turn it into exit 1)."""


@pytest.fixture
def no_pipeline_runs(monkeypatch):
    def stop(self, *args, **kwargs):
        raise _WouldRun()
    monkeypatch.setattr(beam.Pipeline, "run", stop)


def _written_again(write_demo):
    """``write_demo`` memoised on its arguments, file paths by their base names (each run writes into its own
    staging folder; the demo data is fixed): a later call writes the first call's files, byte for byte,
    to its own paths and returns the first call's result."""
    made: dict = {}

    def replay(*args):
        key = tuple(os.path.basename(a) if isinstance(a, str) else a for a in args)
        if key not in made:
            result = write_demo(*args)
            made[key] = result, {i: _read(a) for i, a in enumerate(args) if isinstance(a, str) and os.path.isfile(a)}
        result, files = made[key]
        for i, data in files.items():
            os.makedirs(os.path.dirname(args[i]), exist_ok=True)
            with open(args[i], "wb") as fh:
                fh.write(data)
        return result

    return replay


def _read_once(read):
    """``read(path, *rest)`` memoised on the bytes of the file at ``path`` and ``rest``."""
    seen: dict = {}

    def cached(path, *rest):
        key = (_read(path), rest)
        if key not in seen:
            seen[key] = read(path, *rest)
        return seen[key]

    return cached


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


@pytest.fixture
def demo_made_once(monkeypatch):
    import pipelines.demo_data
    import pipelines.lifelong

    for job in JOBS:
        module = importlib.import_module(f"pipelines.{job}")
        if job != "continual_stats":  # its write_demo takes the plan; it writes demo_data.write_demo_events
            monkeypatch.setattr(module, "write_demo", _written_again(module.write_demo))
    monkeypatch.setattr(pipelines.demo_data, "write_demo_events", _written_again(pipelines.demo_data.write_demo_events))
    monkeypatch.setattr(pipelines.lifelong, "_eval_sets", _read_once(pipelines.lifelong._eval_sets))  # the demo's


@pytest.mark.slow
@pytest.mark.parametrize("job", list(JOBS))
def test_extreme_flag_values_are_one_line_errors_or_valid(job, no_pipeline_runs, demo_made_once, tmp_path, capsys):
    main = importlib.import_module(f"pipelines.{job}").main
    prog = f"python -m pipelines.{job}"
    outcomes = {"error": 0, "valid": 0}
    for flag in JOBS[job]:
        for value in VALUES:
            argv = [f"{flag}={value}", f"--output={tmp_path / 'out'}"]
            try:
                main(argv)
            except _WouldRun:
                outcomes["valid"] += 1
                continue
            except SystemExit as exc:
                err = capsys.readouterr().err.strip()
                assert exc.code == 2, (argv, exc.code, err)
                assert len(err.splitlines()) == 1 and err.startswith(f"{prog}: error:"), (argv, err)
                assert "Traceback" not in err
                outcomes["error"] += 1
                continue
            outcomes["valid"] += 1  # returned without running (nothing to run)
    COUNTS[job] = sum(outcomes.values())
    print(f"\nCLI fuzz {job}: {COUNTS[job]} cases, {outcomes}")
    assert outcomes["error"] > 0
