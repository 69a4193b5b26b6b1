"""Shell commands of the README and docs/*.md: split into commands, each runnable here or skipped for a stated reason,
and the small example input files the commands read (``train.csv``, ``events/*.parquet``, ...)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs.blocks import Block, all_blocks

#: commands that cannot run here, by the first pattern they match, with the reason
NOT_HERE: tuple[tuple[str, str], ...] = (
    (r"gs://|gcloud |docker |DataflowRunner|docker\.pkg\.dev|export PROJECT", "Google Cloud / Dataflow / Docker: no project, no network"),
    (r"--source pubsub|--source kafka|--pubsub-", "Pub/Sub or Kafka: no broker here"),
    (r"FlinkRunner|^flink run", "a Flink cluster (Beam's FlinkRunner downloads its job server jar from Maven)"),
    (r"\.venv-flink|make flink-test", "PyFlink lives in its own venv (make flink-test, tests/flink)"),
    (r"FLINK_HOME|FLINK_CONF_DIR", "a standalone Flink cluster (started, killed and recovered by "
                                    "tests/flink/test_flink_cluster.py in make flink-test)"),
    (r"^curl \"?localhost:8081", "a running Flink cluster's REST API (read by tests/flink/test_cluster_metrics.py "
                                 "in make flink-test)"),
    (r"^pip install", "installs from a package index (network)"),
    (r"^make (demo|test)\b", "make demo / make test create the venv with pip; the demo's own command runs in "
                             "test_readme_shell.py, make test is the whole suite"),
    (r"output/demo", "reads make demo's output: run after the demo by test_demo_then_the_readme_report_command"),
    (r"benchmarks/bench_", "a benchmark: minutes of CPU; its results are the docs' tables"),
)

#: a test key (hex text, as docs/running.md makes one) for the absolute key paths the docs show (/secrets/...)
TEST_KEY = bytes(range(32)).hex()


def commands(block: Block) -> list[str]:
    """The block's commands: continuation lines joined, comments and blank lines dropped, a trailing ``# note`` cut."""
    out: list[str] = []
    pending = ""
    for raw in block.code.splitlines():
        line = raw.rstrip()
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        line = _cut_comment(line)
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip() + " "
            continue
        if pending.count("'") % 2:  # a quoted argument (JSON) spans lines
            pending += "\n"
            continue
        out.append(pending.strip())
        pending = ""
    if pending.strip():
        out.append(pending.strip())
    return out


def _cut_comment(line: str) -> str:
    """``line`` without a trailing ``  # note`` that is outside quotes."""
    for match in re.finditer(r"\s+#\s", line):
        if line[:match.start()].count("'") % 2 == 0 and line[:match.start()].count('"') % 2 == 0:
            return line[:match.start()]
    return line


def not_here(command: str) -> str | None:
    """The reason ``command`` does not run here, or None when it runs here."""
    for pattern, reason in NOT_HERE:
        if re.search(pattern, command):
            return reason
    return None


def shell_blocks() -> list[Block]:
    """Every ``bash`` block of the README and docs/*.md (unlabelled blocks are output, trees or text)."""
    return all_blocks("bash")


def script(block: Block, key_dir: Path) -> str:
    """The runnable commands of ``block`` as one bash script, in order (later commands read what earlier ones
    wrote); absolute key paths ``/secrets/<name>`` are read from ``key_dir``."""
    runnable = [c for c in commands(block) if not not_here(c)]
    return "set -e\n" + "\n".join(c.replace("/secrets/", f"{key_dir}/") for c in runnable) + "\n"


def write_inputs(folder: Path) -> None:
    """The example inputs the docs' commands read: ``python -m pipelines.demo_data --out folder``'s files."""
    from pipelines.demo_data import write_examples

    write_examples(folder)
