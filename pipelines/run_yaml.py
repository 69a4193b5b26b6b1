"""Run a beam_dp Beam YAML template quietly: the same flags as ``python -m apache_beam.yaml.main``
(``--yaml_pipeline_file``, ``--jinja_variables``, any pipeline option), plus ``--verbose``.

    python -m pipelines.run_yaml --yaml_pipeline_file=templates/yaml/continual_sum.yaml \\
      --jinja_variables='{"input": "events.csv", "output": "out", ...}'

Beam's own entry point logs every stage at INFO and prints its progress; this one shows only
beam_dp's warnings and errors (``--verbose`` brings Beam's logs back), and an invalid template
parameter (a ``ValueError`` when the pipeline is built), a missing Jinja variable, malformed YAML or a
missing file is one line ``<prog>: error: ...`` with exit code 2; Ctrl-C is one line and exit code 130
(``beam_dp.cli.guarded``).

Rejected input (as the five jobs, ``pipelines.runner``): a local batch run whose beam_dp transforms
dead-lettered input rows ends with a warning counting them (raw data, not private); with
``--fail-on-rejected FRACTION``, more than that fraction rejected is exit code 3, the dead letters
published and the previous releases kept.

Job budget: a pipeline with several beam_dp transforms declares its total per contribution in its
``options:`` block (``job_epsilon``, ``job_delta``). The pipeline is built once without running to
collect every transform's ``(composition, epsilon, delta)``; shares composing above the total are
refused (exit 2), and in the real build each transform gets its share of the plan, so that every
release row carries the job's spend (``job_epsilon_spent``) and total (``job_epsilon_budget``).

Manifest: before it runs, the pipeline's manifest (``beam_dp.io.manifest``: its transforms, noise
domains, shares, total and release files) is written as ``_beam_dp_manifest.json`` into the folder its
releases are written to, so that ``python -m beam_dp.verify <folder>`` checks the job; a pipeline
writing releases to several folders is refused (exit 2), one writing none to files gets none.

Outputs (as the five jobs, ``pipelines.outputs``): every file the pipeline writes goes under its Jinja
variable ``output`` (the releases and the manifest) or ``dead_letter_output`` (raw data; default: the
sibling ``<output>.private``); a pipeline writing files elsewhere is refused (exit 2). A local batch
run writes into staging folders (the two variables are replaced by them for the run) and publishes
them at success: a failed or interrupted run leaves the previous output byte for byte; a second run
into a folder a running one holds (``<output>.lock``) is refused, as is a folder holding files
beam_dp did not write. A streaming or remote run writes in place and is refused when its folders
already hold files.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import posixpath
import sys
import textwrap
from typing import TYPE_CHECKING, Any

from pipelines.runner import configure_logging, owned_pipeline

if TYPE_CHECKING:
    from pipelines.common import RejectedInput

PROG = "python -m pipelines.run_yaml"
_VARIABLES = "--jinja_variables"
_FAIL_ON_REJECTED = "--fail-on-rejected"


@contextlib.contextmanager
def _argparse_errors():
    """Beam's entry point parses its flags with argparse, which prints a usage block and exits 2 on a
    bad flag (e.g. ``--jinja_variables`` that is not JSON): make that a ``ValueError`` of its message."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            yield
    except SystemExit as exc:
        lines = said.getvalue().strip().splitlines()
        if exc.code in (0, None) or not lines:
            sys.stderr.write(said.getvalue())
            raise
        raise ValueError(lines[-1].split(": error: ", 1)[-1]) from None
    sys.stderr.write(said.getvalue())


def _jinja_variables(argv: list[str]) -> tuple[list[str], dict]:
    """``argv`` without its Jinja variables (``--jinja_variables`` JSON and any ``--jinja_variable_flags``,
    as Beam's entry point reads them) and those variables (``ValueError`` when not a JSON object)."""
    from apache_beam.yaml import main as yaml_main

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument(_VARIABLES, default={}, type=json.loads)
    with _argparse_errors():
        known, rest = parser.parse_known_args(yaml_main._preparse_jinja_flags(argv))
    variables = known.jinja_variables
    if not isinstance(variables, dict):
        raise ValueError(f"{_VARIABLES} must be a JSON object of variables")
    return rest, variables


def _with(argv: list[str], variables: dict) -> list[str]:
    return argv + [f"{_VARIABLES}={json.dumps(variables)}"]


def _plan(argv: list[str]) -> tuple[list[str], Any, set[str], list[tuple[str, str, str]]]:
    """Build the pipeline once without running it: collect every beam_dp transform's share of the
    declared job total (``options: job_epsilon, job_delta``; ``ValueError`` when they compose above it
    or are several with no total, or when releases go to several folders). Returns the flag that gives
    each transform its share in the real build (none without a declared total), the pipeline options,
    the folders of every file sink and the file sinks fed by anything but beam_dp release rows."""
    from apache_beam.options.pipeline_options import StandardOptions
    from apache_beam.yaml import main as yaml_main

    from beam_dp.beam.shell.manifest import release_file_writes, release_folder
    from pipelines.runner import is_local_runner, runner_name
    from pipelines.yaml_transforms import (
        PLANNING,
        ReleaseRecord,
        check_launch_keys,
        non_release_file_writes,
        yaml_budget_plan,
    )

    planning = argv + [f"--beam_dp_budget_plan={PLANNING}"]
    with _argparse_errors():
        options, constructor, _ = yaml_main.build_pipeline_components_from_argv(planning)
    with owned_pipeline(options=options) as pipeline:  # built to be inspected, never run
        constructor(pipeline)
        plan = yaml_budget_plan(pipeline)
        runner = options.view_as(StandardOptions).runner
        check_launch_keys(pipeline, local=runner is None or is_local_runner(runner_name(options)))
        release_folder(pipeline, lambda pcoll: pcoll.element_type is ReleaseRecord)
        every_sink = release_file_writes(pipeline, lambda pcoll: True)  # each sink's input counts as "releases"
        raw = non_release_file_writes(pipeline)
    folders = {posixpath.dirname(prefix) for _, prefix in every_sink}
    return [] if plan is None else [f"--beam_dp_budget_plan={plan}"], options, folders, raw


def _locations(variables: dict, folders: set[str], raw: list[tuple[str, str, str]] = ()) -> tuple[str, str] | None:
    """``(output, dead_letter_output)`` of a pipeline writing files (None when it writes none);
    ``ValueError`` when a file sink writes outside both (it could not be staged), or when a sink of
    ``raw`` (fed by anything but beam_dp release rows) writes under ``output``, which holds releases only."""
    from beam_dp.io.locations import overlap_error
    from pipelines.outputs import normal_location, private_default

    if not folders:
        return None
    output = variables.get("output")
    if not isinstance(output, str) or not output:
        raise ValueError(f"the pipeline writes files under {sorted(folders)[0]} but has no Jinja variable output: "
                         "write every file under {{ output }} (releases) or {{ dead_letter_output }} (dead letters)")
    private = variables.get("dead_letter_output") or private_default(output)
    roots = [normal_location(output), normal_location(str(private))]
    if roots[0] != roots[1] and (nested := overlap_error([("output", output), ("dead_letter_output", str(private))])):
        raise ValueError(nested)
    for folder in sorted(folders):
        place = normal_location(folder)
        if not any(_under(place, root) for root in roots):
            raise ValueError(f"the pipeline writes files under {place}, outside its output ({roots[0]}) and "
                             f"dead_letter_output ({roots[1]}): write every file under one of them")
    for label, prefix, origin in raw:
        if _under(normal_location(posixpath.dirname(prefix)), roots[0]):
            raise ValueError(f"{label} writes data that is not beam_dp releases (from {origin}) under output "
                             f"({roots[0]}), which holds the releases only: write it under dead_letter_output")
    return output, str(private)


def _under(place: str, root: str) -> bool:
    return place == root or place.startswith(root.rstrip("/") + "/")


def _fail_on_rejected(argv: list[str]) -> tuple[list[str], float | None]:
    """``argv`` without ``--fail-on-rejected FRACTION`` and that fraction (``ValueError`` outside [0, 1])."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument(_FAIL_ON_REJECTED, "--fail_on_rejected", dest="fail_on_rejected", type=float, default=None)
    with _argparse_errors():
        known, rest = parser.parse_known_args(argv)
    limit = known.fail_on_rejected
    if limit is not None and not 0 <= limit <= 1:
        raise ValueError(f"{_FAIL_ON_REJECTED} must be a fraction from 0 to 1, got {limit:g}")
    return rest, limit


def _rejected_input(result: Any) -> RejectedInput | None:
    """The run's :class:`pipelines.common.RejectedInput` (None without metrics): the most input rows any one
    beam_dp transform dead-lettered (its ``dead_letters`` counters) among the most it saw (its
    ``elements``, ``querys`` and ``dead_letters``); the transforms read the rows Beam's readers made."""
    from collections import Counter

    from apache_beam.metrics.metric import MetricsFilter

    from pipelines.common import RejectedInput

    try:
        counters = result.metrics().query(MetricsFilter())["counters"]
    except Exception:  # pragma: no cover - a runner without metrics
        return None
    dead, seen = Counter(), Counter()
    for c in counters:
        namespace, name = c.key.metric.namespace, c.key.metric.name
        if namespace.startswith("beam_dp/") and name in ("elements", "querys", "dead_letters"):
            value = int(c.committed if c.committed is not None else c.attempted or 0)
            transform = c.key.step.split("/")[0]
            seen[transform] += value
            dead[transform] += value if name == "dead_letters" else 0
    rejected = max(dead.values(), default=0)
    return RejectedInput(max(max(seen.values(), default=0), rejected), rejected)


def _build_and_run(argv: list[str]) -> Any:
    """``apache_beam.yaml.main.run``, writing the job's manifest beside its releases before running;
    returns the finished run's result."""
    import os

    from apache_beam.yaml import main as yaml_main

    from beam_dp.beam.shell.manifest import write_pipeline_manifest
    from pipelines.yaml_transforms import ReleaseRecord

    options, constructor, display_data = yaml_main.build_pipeline_components_from_argv(argv)
    job = next((os.path.splitext(os.path.basename(a.split("=", 1)[1]))[0] for a in argv
                if a.startswith("--yaml_pipeline_file=")), "yaml")
    with owned_pipeline(options=options, display_data=display_data) as pipeline:
        constructor(pipeline)
        write_pipeline_manifest(pipeline, job, lambda pcoll: pcoll.element_type is ReleaseRecord)
        result = pipeline.run()
        result.wait_until_finish()
    return result


def _help() -> None:
    """What the command does and its flags (no Beam import: fast)."""
    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Run a beam_dp Beam YAML pipeline (templates/yaml/*.yaml): checked at launch (its budget plan, noise "
            "key sources, output folders: the Jinja variable output holds beam_dp releases only), run quietly, "
            "its releases and manifest published under output at success and its raw data (dead letters) under "
            "dead_letter_output (default <output>.private).", 100),
        epilog=textwrap.fill("Any Apache Beam pipeline option (--runner, --streaming, Dataflow or Flink options) is "
                             "accepted too. Exit codes: 0 done, 2 a usage error (one line), 3 more input "
                             "rejected than --fail-on-rejected, 1 a failure, 130 interrupted.", 100) + "\n"
               "Example:\n  python -m pipelines.run_yaml --yaml_pipeline_file=templates/yaml/continual_sum.yaml \\\n"
               "    --jinja_variables='{\"input\": \"events.csv\", \"output\": \"out\", \"start\": 0, "
               "\"period\": 10, \"end\": 40}'")
    parser.add_argument("--yaml_pipeline_file", metavar="PATH", required=True,
                        help="the YAML pipeline to run (a beam_dp template or your own using templates/yaml/"
                             "providers.yaml); relative includes resolve from the current folder")
    parser.add_argument(_VARIABLES, metavar="JSON",
                        help="the template's Jinja variables as a JSON object, e.g. input, output, "
                             "dead_letter_output, epsilon, the schedule and the noise key location "
                             "(noise_key_env | noise_key_file | noise_key_secret; never the key itself)")
    parser.add_argument("--jinja_variable_flags", metavar="NAMES",
                        help="Beam's: names of flags (--NAME=value) read as further Jinja variables")
    parser.add_argument(_FAIL_ON_REJECTED, metavar="FRACTION", type=float,
                        help="exit with code 3, publishing the dead letters but not the releases (the previous "
                             "output is kept), when more than this fraction (0 to 1) of the input rows was "
                             "rejected; without it a run with rejected rows ends with a warning. Local batch "
                             "runs only.")
    parser.add_argument("--verbose", action="store_true", help="show Beam's logs and a failure's traceback")
    parser.print_help()


def main(argv: list[str] | None = None) -> int:
    from beam_dp.cli import guarded
    from pipelines.outputs import OutputError

    command = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        _help()
        return 0
    verbose = "--verbose" in argv
    argv = [a for a in argv if a != "--verbose"]
    configure_logging(verbose)
    import jinja2
    import yaml

    where: list = []  # the run's RunOutputs once opened: a failure says what it kept
    return guarded(PROG, verbose, lambda: _run(argv, verbose, where),
                   (ValueError, KeyError, jinja2.TemplateError, yaml.YAMLError, FileNotFoundError, IsADirectoryError,
                    OutputError), lambda: f"; {where[0].kept()}" if where else "", command=command)


def _staged(options: Any) -> bool:
    """Whether the run is staged and published: a local batch run (the launcher waits for it); no
    runner named is Beam's local default."""
    from apache_beam.options.pipeline_options import StandardOptions

    from pipelines.runner import is_local_runner, runner_name

    standard = options.view_as(StandardOptions)
    return (standard.runner is None or is_local_runner(runner_name(options))) and not standard.streaming


def _run(argv: list[str], verbose: bool, where: list) -> int:
    from beam_dp.cli import CommandError
    from pipelines.outputs import RunOutputs
    from pipelines.paths import display
    from pipelines.runner import REJECTED_EXIT

    argv, limit = _fail_on_rejected(argv)
    argv, variables = _jinja_variables(argv)
    said = io.StringIO()
    rejected, private = None, None
    with contextlib.redirect_stdout(sys.stdout if verbose else said):
        budget, options, folders, raw = _plan(_with(argv, variables))
        staged = _staged(options)
        if limit is not None and not staged:
            raise ValueError(f"{_FAIL_ON_REJECTED} needs a local batch run (the launcher counts the rejected rows "
                             "when the run has ended)")
        locations = _locations(variables, folders, raw)
        with (RunOutputs(*locations, staged=staged, flags=("output", "dead_letter_output")) if locations
              else contextlib.nullcontext()) as outputs:
            if outputs is not None:
                where.append(outputs)
                variables = dict(variables, output=outputs.output, dead_letter_output=outputs.private)
                private = display(outputs.final_private)
            result = _build_and_run(_with(argv, variables) + budget)
            rejected = _rejected_input(result) if staged else None
            if rejected is not None and limit is not None and rejected.fraction > limit:
                if outputs is not None:
                    outputs.publish(releases=False)  # the dead letters say why; the releases do not replace
                kept = f", its dead letters are under {private}" if private else ""
                raise CommandError(f"{rejected.line()}, more than {_FAIL_ON_REJECTED} {limit:g}: this run's "
                                   f"releases were not published{kept}", REJECTED_EXIT)
            if outputs is not None:
                outputs.publish()
    print(f"beam_dp yaml: ran {next((a.split('=', 1)[1] for a in argv if a.startswith('--yaml_pipeline_file=')), '')}")
    if rejected is not None and rejected.rejected:
        sys.stdout.flush()
        print(f"warning: {rejected.line()}" + (f"; dead letters under {private}" if private else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
