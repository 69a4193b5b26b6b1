"""The embedded default dataset of ``continual_stats``: a deterministic synthetic event stream.

Ten shops (``shop-01`` .. ``shop-10``) report purchases over 14 days of event time starting
2026-01-01T00:00Z. Each event carries two values: basket value in hundreds of euros (heavy-tailed,
so some baskets get clipped) and the number of items in tens. Arrival rates follow a daily cycle
and shop-07 is closed on days 5–7, so empty steps occur. Generated from a fixed seed: the same
file every time, no download.
"""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where the data is made: the job's --help stays fast
    import numpy as np

__all__ = ["DEMO_END", "DEMO_PERIOD", "DEMO_START", "DEMO_STREAMS", "write_demo_events"]

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
