"""Shell commands of the README and docs/*.md: split into commands, each runnable here or skipped for a stated reason,
and the small example input files the commands read (``train.csv``, ``events/*.parquet``, ...)."""

from __future__ import annotations

import json
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
    """The example inputs the docs' commands read, made from the jobs' public default datasets (small)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines import growing_db_queries, lifelong, model_release, online_learning
    from pipelines.demo_data import demo_events

    folder.mkdir(parents=True, exist_ok=True)
    # ERM examples: the digits of classes 0, 1, 2 (the commands' --classes 0,1,2), 64 features
    model_release.write_demo(str(folder / "digits.csv"))
    lines = (folder / "digits.csv").read_text().splitlines()
    train = "\n".join([lines[0], *(row for row in lines[1:] if row.rsplit(",", 1)[1] in "012")]) + "\n"
    (folder / "train.csv").write_text(train)
    (folder / "train").mkdir(exist_ok=True)
    (folder / "train" / "part-0.csv").write_text(train)
    (folder / "digits.csv").unlink()
    # events: every 50th demo event (10 shops, 2 values, 14 days of hourly steps from 1767225600)
    ids, ts, values = demo_events()
    keep = slice(None, None, 50)
    (folder / "events").mkdir(exist_ok=True)
    pq.write_table(pa.table({"stream_id": ids[keep], "timestamp": ts[keep], "value_0": values[keep, 0],
                             "value_1": values[keep, 1]}), folder / "events" / "part-0.parquet")
    # one-value events for the YAML templates' schedule (start 0, period 10, end 40)
    rng = np.random.default_rng(0)
    (folder / "events.csv").write_text("stream_id,timestamp,value_0\n" + "".join(
        f"{s},{t:.2f},{v:.3f}\n" for s, t, v in zip(rng.choice(["a", "b"], 60), rng.uniform(0, 40, 60),
                                                   rng.uniform(-1, 1, 60))))
    # growing database: elements and queries (predicate as JSON text in the CSV)
    growing_db_queries.write_demo(str(folder / "elements.csv"), str(folder / "queries.jsonl"))
    queries = [json.loads(line) for line in (folder / "queries.jsonl").read_text().splitlines()]
    (folder / "queries.jsonl").unlink()
    (folder / "queries.csv").write_text("stream_id,query_id,t,predicate\n" + "".join(
        f'{q["stream_id"]},{q["query_id"]},{q["t"]},"{json.dumps(q["predicate"]).replace(chr(34), chr(34) * 2)}"\n'
        for q in queries))
    # online records (labels -1/+1) with a timestamp in [0, 60) for the event-time regression schedule
    online_learning.write_demo(str(folder / "r.csv"), "online")
    rows = (folder / "r.csv").read_text().splitlines()
    (folder / "r.csv").write_text("\n".join([rows[0] + ",timestamp"] + [f"{row},{60 * i / len(rows):.3f}"
                                                                       for i, row in enumerate(rows[1:])]) + "\n")
    # lifelong: permuted digits in 3 tasks and their eval sets
    lifelong.write_demo(str(folder / "tasks.csv"), str(folder / "eval.csv"))
