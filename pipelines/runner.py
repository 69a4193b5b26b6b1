"""The one runner of every beam_dp job: flags from the job's spec, one-line usage errors, the noise
key rules, quiet logs, a run that does not block on a remote runner, and a summary.

A job module (``pipelines/<job>.py``) declares a :class:`Job`: ``plan`` (validate the flags and
files, build the params; raise :class:`UsageError` for anything the user must fix), ``build``
(add the job to a pipeline), ``write_demo`` (the demo input, when the job runs without one) and
``summary`` (its own lines after a local run). :func:`run_cli` gives every job the same behaviour:

* ``--help`` lists the job's flags, built from :mod:`pipelines.spec` without importing Beam;
* an unknown flag, a bad value, a missing file, an invalid privacy parameter, a missing noise key
  where one is needed, or a whole input rejected for one structural cause prints **one line**
  ``<prog>: error: <what to fix>`` on stderr and exits with code 2;
* logs of Beam and other libraries are hidden unless ``--verbose``; beam_dp's own warnings show;
* Ctrl-C, SIGTERM and SIGHUP end the run with one line and exit code 130, 143 or 129, the previous
  output kept and the run's staging folders, locks and Beam temporary folder removed
  (``beam_dp.cli.guarded``); nothing is set up when a module is imported;
* a local run that rejected input rows ends with a warning counting them (raw data, not private);
  with ``--fail-on-rejected FRACTION``, more than that fraction rejected is exit code 3, the dead
  letters published and the previous releases kept;
* the default runner is the FnApiRunner; on a local runner the job waits and prints a summary of
  its outputs, on any other runner (Dataflow, Flink, a Flex Template launch) it returns once submitted;
* a local run from the job's own command line (``python -m pipelines.<job>``) keeps its shuffles on
  disk while it runs (``pipelines.local_runner``: Beam's runner as it was once the run ends);
  ``main(argv)`` called from Python runs on Beam's runner as it is.

Noise key rules: a streaming job, or a job on any runner but the local ones, must name a fixed key
(``--noise-key-secret``, ``--noise-key-file``, or ``--noise-key-env`` for an env var set on the
workers; locally an env var already set counts): with a random key per worker a retried or
duplicated bundle would draw different noise. ``--allow-random-noise-key`` waives the rule. One
source at most may be named, and a named one that is missing or unusable is a usage error at launch
(``pipelines.common.check_key_sources``); a local batch job naming none uses one random key, said once.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from pipelines import spec
from pipelines.paths import display
from pipelines.usage import UsageError

__all__ = ["LOCAL_RUNNERS", "Job", "UsageError", "configure_logging", "is_local_runner", "options_class",
           "owned_pipeline", "run_cli"]

log = logging.getLogger("beam_dp.pipelines")

#: Runners that execute in this process or on this machine (the job waits for them).
LOCAL_RUNNERS = ("FnApiRunner", "DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")
KEY_ENV_VAR = "BEAM_DP_NOISE_KEY"


@contextlib.contextmanager
def owned_pipeline(**kwargs: Any):
    """A ``beam.Pipeline(**kwargs)`` whose local temporary folder is removed when the block ends.

    Beam makes that folder (``beam-pipeline-temp*``) in ``Pipeline.__init__`` and removes it only in
    ``run``: a pipeline built to be inspected (a YAML job's budget plan) or one whose construction fails
    would otherwise leave a folder behind at every launch."""
    import shutil

    import apache_beam as beam

    pipeline = beam.Pipeline(**kwargs)
    try:
        yield pipeline
    finally:
        shutil.rmtree(pipeline.local_tempdir, ignore_errors=True)


@dataclass(frozen=True)
class Job:
    """One job: its name (``pipelines.<name>``, spec ``pipelines.spec.JOBS[name]``) and its steps."""

    name: str
    description: str
    plan: Callable[[Any], Any]
    build: Callable[..., Any]
    summary: Callable[[Any, Any], list[str]]
    write_demo: Callable[[Any], str] | None = None

    @property
    def prog(self) -> str:
        return f"python -m pipelines.{self.name}"


# -- logging ---------------------------------------------------------------------------------------
class _OwnWarnings(logging.Filter):
    """Quiet mode: beam_dp's warnings and errors pass; other libraries' logs do not (a failure still
    ends the run with its exception, or one line for a usage error)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.startswith("beam_dp") and record.levelno >= logging.WARNING


class _JobFlagsFilter(logging.Filter):
    """Beam warns about every flag of a ``JobOptions`` job when the pipeline runs (it only knows the
    direct ``PipelineOptions`` subclasses); those flags were validated by ``pipelines.common.check_flags``."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(("Unparseable argument", "Discarding unparseable args"))


def configure_logging(verbose: bool) -> None:
    """A command's logs (never set at import): quiet (default) or verbose (INFO from every library) on
    stderr, set before Beam is imported so that its import-time warnings (e.g. about apitools) follow
    the same rule; Beam's warnings about the job's own flags are dropped."""
    flags_logger = logging.getLogger("apache_beam.options.pipeline_options")
    if not any(isinstance(f, _JobFlagsFilter) for f in flags_logger.filters):
        flags_logger.addFilter(_JobFlagsFilter())
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    if not verbose:
        handler.addFilter(_OwnWarnings())
        warnings.simplefilter("ignore")
    root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    logging.captureWarnings(True)


# -- options -----------------------------------------------------------------------------------------
_OPTION_CLASSES: dict[str, type] = {}


def options_class(job: str) -> type:
    """The job's ``PipelineOptions`` subclass (a ``JobOptions``: parsed only by its own job)."""
    if job not in _OPTION_CLASSES:
        from pipelines.common import JobOptions

        def _add_argparse_args(cls, parser) -> None:
            spec.add_flags(parser, job)

        name = "".join(part.capitalize() for part in job.split("_")) + "Options"
        _OPTION_CLASSES[job] = type(name, (JobOptions,), {"_add_argparse_args": classmethod(_add_argparse_args)})
    return _OPTION_CLASSES[job]


def _normalise(argv: list[str]) -> list[str]:
    """Flex Templates pass ``--streaming=true``; Beam's ``--streaming`` takes no value."""
    out = []
    for arg in argv:
        if arg.startswith("--streaming="):
            try:
                streaming = spec.boolean(arg.split("=", 1)[1])
            except argparse.ArgumentTypeError as exc:
                raise UsageError(f"argument --streaming: {exc}") from None
            if streaming:
                out.append("--streaming")
        else:
            out.append(arg)
    return out


def _verbose(argv: list[str]) -> bool:
    value = None
    for arg in argv:
        if arg == "--verbose":
            value = True
        elif arg.startswith("--verbose="):
            try:
                value = spec.boolean(arg.split("=", 1)[1])
            except argparse.ArgumentTypeError:
                value = False
    return bool(value)


def runner_name(options) -> str:
    from apache_beam.options.pipeline_options import StandardOptions

    runner = options.view_as(StandardOptions).runner
    return runner if isinstance(runner, str) else type(runner).__name__


def is_local_runner(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in LOCAL_RUNNERS or name.lower() == "direct"


# -- noise key -------------------------------------------------------------------------------------
def noise_key_of(opts) -> Any:
    """The key *location* (never the key) from the flags, checked at launch as the workers will read it
    (``pipelines.common.check_key_sources``: one source at most; a named one that is missing or
    unusable is a usage error)."""
    from apache_beam.options.pipeline_options import StandardOptions

    from beam_dp.beam import NoiseKey
    from pipelines.common import check_key_sources

    local = opts.view_as(StandardOptions).runner is None or is_local_runner(runner_name(opts))  # None: Beam's local
    check_key_sources(opts.noise_key_secret, opts.noise_key_file, opts.noise_key_env, local)
    return NoiseKey(env_var=opts.noise_key_env or KEY_ENV_VAR, key_file=opts.noise_key_file,
                    secret=opts.noise_key_secret)


@contextlib.contextmanager
def one_random_key(opts):
    """A local job with no key: one random key for the whole run (every transform and worker of this
    process, each in its own noise domain, through the key env var while the run lasts), said once."""
    env_var = opts.noise_key_env or KEY_ENV_VAR
    if opts.noise_key_secret or opts.noise_key_file or os.environ.get(env_var):
        yield
        return
    log.warning("beam_dp: no noise key given (--noise-key-file, --noise-key-secret or the env var %s): this run "
                "uses a random key; its releases are not reproducible", env_var)
    os.environ[env_var] = os.urandom(32).hex()
    try:
        yield
    finally:
        os.environ.pop(env_var, None)


def check_noise_key(opts, runner: str, streaming: bool) -> None:
    """Refuse a streaming or remote job without a fixed noise key (see the module docstring)."""
    if opts.allow_random_noise_key or opts.noise_key_secret or opts.noise_key_file:
        return
    local = is_local_runner(runner)
    if not streaming and local:
        return
    if opts.noise_key_env and not local:
        return  # the user states the workers have it
    if local and os.environ.get(opts.noise_key_env or KEY_ENV_VAR):
        return
    where = "a streaming job" if streaming else f"a job on {runner}"
    raise UsageError(f"{where} needs a fixed noise key (--noise-key-secret, --noise-key-file or --noise-key-env): "
                     "with a random key per worker a retried bundle draws different noise; "
                     "--allow-random-noise-key accepts that")


# -- the run ---------------------------------------------------------------------------------------
def _help(job: Job) -> None:
    parser = argparse.ArgumentParser(
        prog=job.prog, description=job.description + " Any Apache Beam pipeline option (--runner, --streaming, "
        "Dataflow or Flink options) is accepted too; the default runner is the FnApiRunner.")
    spec.add_flags(parser, job.name)
    parser.print_help()


def parse(argv: list[str], job: Job):
    """``PipelineOptions`` from the flags (unknown flags and bad values are usage errors)."""
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    from pipelines.common import check_flags

    check_flags(argv, options_class(job.name))
    options = PipelineOptions(argv)
    if not any(a == "--runner" or a.startswith("--runner=") for a in argv):
        options.view_as(StandardOptions).runner = "FnApiRunner"  # skip the Prism download attempt
    return options


def run(options, job: Job, plan: Any, messages=None, shown: str | None = None, rejected: list | None = None) -> str:
    """Build and run the job; on a local runner wait and summarise, elsewhere return once submitted.
    ``shown``: the output folder as the user named it (the run itself may write to a staging folder).
    ``rejected``: gets the run's ``pipelines.common.RejectedInput`` (local runs; raw-data counts)."""
    from pipelines.common import exact_counts, output_summary, rejected_input, write_job_manifest
    from pipelines.outputs import private_dir
    from pipelines.paths import display
    from pipelines.progress import Progress, input_bytes

    opts = options.view_as(options_class(job.name))
    shown = display(shown or plan.out_dir)
    if plan.demo and job.write_demo is not None:
        log.info("%s", job.write_demo(plan))
    runner = runner_name(options)
    local = is_local_runner(runner)
    size = input_bytes([getattr(opts, name, None) for name in ("input", "queries", "eval_input")]) if local else None
    with owned_pipeline(options=options) as pipeline:
        job.build(pipeline, plan, opts, messages)
        with _structural_errors_as_usage_errors(), Progress(size, enabled=None if local else False):
            result = pipeline.run()
            if local:
                result.wait_until_finish()
    write_job_manifest(pipeline, job.name, plan.out_dir)  # declares the job beside its releases (beam_dp.verify)
    if not local:
        job_id = getattr(result, "job_id", lambda: None)
        job_id = job_id() if callable(job_id) else job_id
        return (f"beam_dp {job.name}: submitted to {runner}" + (f" as job {job_id}" if job_id else "")
                + f"; releases will be written under {shown}, dead letters (raw data) under "
                + display(private_dir(opts)))
    lines = [f"beam_dp {job.name}: releases written under {shown}"]
    lines += job.summary(plan, opts)
    lines += output_summary(plan.out_dir, plan.outputs)
    if opts.print_exact_counts:
        lines += exact_counts(result, private_dir(opts))
    if rejected is not None:
        rejected.append(rejected_input(result))
    return "\n".join(lines)


@contextlib.contextmanager
def _structural_errors_as_usage_errors():
    """A worker's ``StructuralInputError`` (a whole file unusable, e.g. a missing column) reaches the
    launcher wrapped in the runner's own exception; report it as one line instead of a traceback."""
    from beam_dp.io.sources import STRUCTURAL

    try:
        yield
    except Exception as exc:  # the runner's wrapper type varies; the marker is in the message
        text = f"{exc}"
        if STRUCTURAL not in text:
            raise
        line = text[text.index(STRUCTURAL):].splitlines()[0].split(" [while running")[0]
        raise UsageError(line[:500]) from None


def run_cli(argv: list[str] | None, job: Job) -> int:
    """Parse, validate (``plan``), check the noise key and the output locations, run into staging
    folders, publish at success and print the summary. Exit codes: 2 and one line for a usage error,
    3 for more rejected rows than ``--fail-on-rejected``, 130 / 143 / 129 and one line for Ctrl-C /
    SIGTERM / SIGHUP, 1 and one line for any other failure (``--verbose``: its traceback); in each case
    the line says what was kept of the previous output."""
    command = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        _help(job)
        return 0
    from beam_dp.cli import exit_now, guarded
    from pipelines.outputs import OutputError

    verbose = _verbose(argv)
    configure_logging(verbose)
    where: list = []  # the run's RunOutputs once opened: a failure says what it kept
    code = guarded(job.prog, verbose, lambda: _launch(argv, job, where, command), (UsageError, OutputError),
                   lambda: f"; {where[0].kept()}" if where else "", command)  # SIGTERM/SIGHUP too (command)
    if command:  # the process's own command line, its outputs published: its objects frozen for the exit
        exit_now(code)
    return code


#: exit code of a run that rejected more than ``--fail-on-rejected`` of its input rows
REJECTED_EXIT = 3


def _launch(argv: list[str], job: Job, where: list, command: bool) -> int:
    """The run of :func:`run_cli`; ``command``: the process's own command line, whose local run has Beam's
    in-process runner tuned while it runs (``pipelines.local_runner``)."""
    from apache_beam.options.pipeline_options import StandardOptions

    from beam_dp.cli import CommandError
    from pipelines.outputs import RunOutputs, private_dir

    options = parse(_normalise(argv), job)
    streaming = bool(options.view_as(StandardOptions).streaming)
    opts = options.view_as(options_class(job.name))
    params_or_usage_error(lambda: spec.validate(job.name, opts), "flags")
    check_noise_key(opts, runner_name(options), streaming)
    local = is_local_runner(runner_name(options))
    limit = opts.fail_on_rejected
    if limit is not None and not 0 <= limit <= 1:
        raise UsageError(f"--fail-on-rejected must be a fraction from 0 to 1, got {limit:g}")
    if limit is not None and (streaming or not local):
        raise UsageError("--fail-on-rejected needs a local batch run (the launcher counts the rejected rows "
                         "when the run has ended)")
    if local and command:  # this process runs this job only: its shuffles on disk while it runs
        from pipelines.local_runner import tuned_local_runner
    else:
        tuned_local_runner = contextlib.nullcontext
    with RunOutputs(opts.output, private_dir(opts), staged=local and not streaming) as outputs:
        where.append(outputs)
        opts.output, opts.dead_letter_output = outputs.output, outputs.private
        plan = job.plan(options)
        found: list = []
        with one_random_key(opts) if local else contextlib.nullcontext(), tuned_local_runner():
            summary = run(options, job, plan, shown=outputs.final_output, rejected=found)
        rejected = found[0] if found else None
        if rejected is not None and limit is not None and rejected.fraction > limit:
            outputs.publish(releases=False)  # the dead letters say why; the releases of so little data do not replace
            raise CommandError(f"{rejected.line()}, more than --fail-on-rejected {limit:g}: this run's releases "
                               f"were not published, its dead letters are under {display(outputs.final_private)}",
                               REJECTED_EXIT)
        outputs.publish()
    if local:
        summary += (f"\n  dead letters (raw data, not private) and any demo input: under "
                    f"{display(outputs.final_private)}")
    print(summary)
    if rejected is not None and rejected.rejected:
        sys.stdout.flush()
        print(f"warning: {rejected.line()}; dead letters under {display(outputs.final_private)}", file=sys.stderr)
    return 0


def params_or_usage_error(build: Callable[[], Any], what: str) -> Any:
    """Build a params object; its ``ValueError`` (invalid privacy parameter) becomes a usage error."""
    try:
        return build()
    except ValueError as exc:
        raise UsageError(f"{what}: {exc}") from None


def split_list(text: str | None, flag: str) -> tuple[str, ...] | None:
    """A comma-separated flag value -> its non-empty items (None when not given; given but empty is an error)."""
    if text is None:
        return None
    items = tuple(s.strip() for s in text.split(",") if s.strip())
    if not items:
        raise UsageError(f"{flag} is empty: give comma-separated values or leave the flag out")
    return items


def lateness(opts, params_class: type) -> dict:
    """``{"allowed_lateness": ...}`` when ``--allowed-lateness`` is given and the family's step params
    have the field (the hook for the lateness work on the step params); a usage error if they do not."""
    if opts.allowed_lateness is None:
        return {}
    if "allowed_lateness" not in getattr(params_class, "__dataclass_fields__", {}):
        raise UsageError(f"--allowed-lateness is not supported by {params_class.__name__} in this version")
    return {"allowed_lateness": opts.allowed_lateness}


def budget_shares(opts, names: list[str]) -> Any:
    """The job's total ``(--epsilon, --delta)`` split among its transforms ``names`` by the one rule of every
    engine (``beam_dp.core.budget.flag_budget``): pure epsilons add, Gaussian transforms compose through their mu."""
    from beam_dp.core.budget import flag_budget

    return params_or_usage_error(
        lambda: flag_budget(opts.epsilon, opts.delta, getattr(opts, "noise", None), names), "job budget")


def verified_lines(verifier) -> list[str]:
    """The job's total spend recomputed from its written releases (a ``beam_dp.verify.JobVerifier`` fed
    with them), none if it saw no release."""
    if not verifier.rows:
        return []
    verdict = verifier.verdict()
    return [f"  verified from the release files: worst contribution spends epsilon {verdict.worst_epsilon:.4g} "
            f"of {verdict.epsilon:g}" if verdict.ok else "  NOT verified: " + "; ".join(verdict.problems)]
