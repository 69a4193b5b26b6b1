"""Run a beam_dp Beam YAML template quietly: the same flags as ``python -m apache_beam.yaml.main``
(``--yaml_pipeline_file``, ``--jinja_variables``, any pipeline option), plus ``--verbose``.

    python -m pipelines.run_yaml --yaml_pipeline_file=templates/yaml/continual_sum.yaml \\
      --jinja_variables='{"input": "events.csv", "output": "out", ...}'

Beam's own entry point logs every stage at INFO and prints its progress; this one shows only
beam_dp's warnings and errors (``--verbose`` brings Beam's logs back), and an invalid template
parameter (a ``ValueError`` when the pipeline is built), a missing Jinja variable, malformed YAML or a
missing file is one line ``<prog>: error: ...`` with exit code 2; Ctrl-C is one line and exit code 130
(``beam_dp.cli.guarded``).

Job budget: a pipeline with several beam_dp transforms declares its total per contribution in its
``options:`` block (``job_epsilon``, ``job_delta``). The pipeline is built once without running to
collect every transform's ``(composition, epsilon, delta)``; shares composing above the total are
refused (exit 2), and in the real build each transform gets its share of the plan, so that every
release row carries the job's spend (``job_epsilon_spent``) and total (``job_epsilon_budget``).

Manifest: before it runs, the pipeline's manifest (``beam_dp.io.manifest``: its transforms, noise
domains, shares, total and release files) is written as ``_beam_dp_manifest.json`` into the folder its
releases are written to, so that ``python -m beam_dp.verify <folder>`` checks the job; a pipeline
writing releases to several folders is refused (exit 2), one writing none to files gets none.
"""

from __future__ import annotations

import contextlib
import io
import sys

from pipelines.runner import configure_logging

PROG = "python -m pipelines.run_yaml"


def _budget_plan(argv: list[str]) -> list[str]:
    """Build the pipeline once without running it, collecting every beam_dp transform's share of the
    declared job total (``options: job_epsilon, job_delta``; ``ValueError`` when they compose above it
    or are several with no total), and return the flag that gives each transform its share in the
    real build (none without a declared total)."""
    import apache_beam as beam
    from apache_beam.yaml import main as yaml_main

    from pipelines.yaml_transforms import PLANNING, yaml_budget_plan

    planning = argv + [f"--beam_dp_budget_plan={PLANNING}"]
    options, constructor, _ = yaml_main.build_pipeline_components_from_argv(planning)
    pipeline = beam.Pipeline(options=options)
    constructor(pipeline)
    plan = yaml_budget_plan(pipeline)
    return [] if plan is None else [f"--beam_dp_budget_plan={plan}"]


def _build_and_run(argv: list[str]) -> None:
    """``apache_beam.yaml.main.run``, writing the job's manifest beside its releases before running."""
    import os

    import apache_beam as beam
    from apache_beam.yaml import main as yaml_main

    from beam_dp.beam.manifest import write_pipeline_manifest
    from pipelines.yaml_transforms import ReleaseRecord

    options, constructor, display_data = yaml_main.build_pipeline_components_from_argv(argv)
    pipeline = beam.Pipeline(options=options, display_data=display_data)
    constructor(pipeline)
    job = next((os.path.splitext(os.path.basename(a.split("=", 1)[1]))[0] for a in argv
                if a.startswith("--yaml_pipeline_file=")), "yaml")
    write_pipeline_manifest(pipeline, job, lambda pcoll: pcoll.element_type is ReleaseRecord)
    pipeline.run().wait_until_finish()


def main(argv: list[str] | None = None) -> int:
    from beam_dp.cli import guarded

    command = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in argv
    argv = [a for a in argv if a != "--verbose"]
    configure_logging(verbose)
    import jinja2
    import yaml

    return guarded(PROG, verbose, lambda: _run(argv, verbose),
                   (ValueError, KeyError, jinja2.TemplateError, yaml.YAMLError, FileNotFoundError, IsADirectoryError),
                   command=command)


def _run(argv: list[str], verbose: bool) -> int:
    said = io.StringIO()
    with contextlib.redirect_stdout(sys.stdout if verbose else said):
        _build_and_run(argv + _budget_plan(argv))
    print(f"beam_dp yaml: ran {next((a.split('=', 1)[1] for a in argv if a.startswith('--yaml_pipeline_file=')), '')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
