"""The embedded default dataset of ``continual_stats``: a deterministic synthetic event stream.

Ten shops (``shop-01`` .. ``shop-10``) report purchases over 14 days of event time starting
2026-01-01T00:00Z. Each event carries two values: basket value in hundreds of euros (heavy-tailed,
so some baskets get clipped) and the number of items in tens. Arrival rates follow a daily cycle
and shop-07 is closed on days 5–7, so empty steps occur. Generated from a fixed seed: the same
file every time, no download.

``python -m pipelines.demo_data --out DIR`` writes an example input of every job under ``DIR``, under
the names the README's commands read (:data:`EXAMPLE_FILES`), all made from the jobs' public default
datasets: the files a first run of each command needs.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where the data is made: the job's --help stays fast
    import numpy as np

__all__ = ["DEMO_END", "DEMO_PERIOD", "DEMO_START", "DEMO_STREAMS", "EXAMPLE_FILES", "main", "write_demo_events",
           "write_examples"]

DEMO_START = 1767225600.0  # 2026-01-01T00:00:00Z
DEMO_PERIOD = 3600.0  # one-hour steps
DEMO_DAYS = 14
DEMO_END = DEMO_START + DEMO_DAYS * 86400.0
DEMO_STREAMS = tuple(f"shop-{i:02d}" for i in range(1, 11))


def demo_events(seed: int = 20260101) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(stream_ids, timestamps, values (n, 2))`` of the demo stream, sorted by time."""
    import numpy as np

    rng = np.random.default_rng(seed)
    hours = np.arange(DEMO_DAYS * 24)
    daily = 0.3 + np.clip(np.sin((hours % 24 - 7) / 14 * np.pi), 0, None)  # open roughly 7:00-21:00
    ids, ts, vals = [], [], []
    for k, shop in enumerate(DEMO_STREAMS):
        rate = (20 + 8 * k) * daily
        if shop == "shop-07":
            rate = np.where((hours >= 4 * 24) & (hours < 7 * 24), 0.0, rate)
        counts = rng.poisson(rate)
        n = int(counts.sum())
        t = DEMO_START + (np.repeat(hours, counts) + rng.random(n)) * DEMO_PERIOD
        basket = rng.lognormal(mean=-1.2 + 0.05 * k, sigma=0.8, size=n)
        items = rng.poisson(3 + k % 4, size=n) / 10.0
        ids.append(np.full(n, shop))
        ts.append(t)
        vals.append(np.stack([basket, items], axis=1))
    stream_ids, timestamps, values = np.concatenate(ids), np.concatenate(ts), np.concatenate(vals)
    order = np.argsort(timestamps, kind="stable")
    return stream_ids[order], timestamps[order], values[order]


def write_demo_events(path: str) -> int:
    """Write the demo events to a CSV file (any Beam filesystem); returns the number of events."""
    from pipelines.paths import write_text

    stream_ids, timestamps, values = demo_events()
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["stream_id", "timestamp", "value_0", "value_1"])
    for sid, t, (v0, v1) in zip(stream_ids, timestamps, values):
        writer.writerow([sid, f"{t:.6f}", f"{v0:.6f}", f"{v1:.6f}"])
    write_text(path, text.getvalue())
    return len(stream_ids)


#: the example inputs :func:`write_examples` writes, by the job commands that read them
EXAMPLE_FILES = {
    "train.csv, train/part-0.csv": "model_release, model_release.yaml: digits of classes 0, 1, 2 (x_0..x_63, label)",
    "events/part-0.parquet": "continual_stats: every 50th demo event (stream_id, timestamp, value_0, value_1)",
    "events.csv": "the YAML templates' sums: one value per event, timestamps in [0, 40)",
    "elements.csv, queries.csv": "growing_db_queries: elements and queries (predicate as JSON text)",
    "r.csv": "online_learning: records x_0.., label (-1/+1) and timestamp in [0, 60)",
    "tasks.csv, eval.csv": "lifelong: permuted digits in 3 tasks (task_id 0, 1, 2) and their eval sets",
}


def write_examples(folder: str | Path) -> list[str]:
    """Write an example input of every job under the local ``folder`` (see :data:`EXAMPLE_FILES`); returns the
    paths written, relative to ``folder``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines import growing_db_queries, lifelong, model_release, online_learning

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # ERM examples: the digits of classes 0, 1, 2 (the commands' --classes 0,1,2), 64 features
    model_release.write_demo(str(folder / "digits.csv"))
    lines = (folder / "digits.csv").read_text().splitlines()
    train = "\n".join([lines[0], *(row for row in lines[1:] if row.rsplit(",", 1)[1] in "012")]) + "\n"
    (folder / "train.csv").write_text(train)
    (folder / "train").mkdir(exist_ok=True)
    (folder / "train" / "part-0.csv").write_text(train)
    (folder / "digits.csv").unlink()
    # events: every 50th demo event (10 shops, 2 values, 14 days of hourly steps from DEMO_START)
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
    return [name for names in EXAMPLE_FILES for name in names.split(", ")]


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.demo_data --out DIR``: write every job's example input; exit 2 on a usage error."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.demo_data", description=(
        "Write an example input of every job (public demo datasets) under the names the README's commands read."))
    parser.add_argument("--out", required=True, help="local folder to write into (created if missing)")
    opts = parser.parse_args(argv)
    try:
        write_examples(opts.out)
    except OSError as error:
        print(f"{parser.prog}: error: cannot write under {opts.out!r}: {error.strerror or error}", file=sys.stderr)
        return 2
    print(f"beam_dp demo_data: example inputs written under {opts.out}")
    for names, what in EXAMPLE_FILES.items():
        print(f"  {names}: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
