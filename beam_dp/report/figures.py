"""Report figures from release rows (any mechanism: one schema, ``beam_dp.io.ReleaseRow``).

* ``values_<mechanism>.png``: the released value (first coordinates; for mapping-valued releases,
  the first part) per step, per stream, with a band of ``± band × noise std``: the per-coordinate
  standard deviation of the release error, ``meta["noise_std"]`` where the mechanism reports it, or
  derived from an output-perturbed model's ``law``/``noise_scale`` (Gaussian: σ; K-norm in d
  dimensions: √(d+1)·b). Releases without either (projected or post-processed models) are drawn
  without a band, and the title says so;
* ``privacy_spend.png``: ``epsilon_spent`` (and ``delta_spent`` when non-zero) per step per stream,
  with the budget as a dashed line;
* ``accuracy.png``: where the release meta has an accuracy (e.g. model-snapshot accuracy; a mapping
  of per-task accuracies, as lifelong snapshots carry, is drawn as their mean), per step per stream;
* ``summary.json`` and one summary line: rows read, streams, steps released, dead letters.

Releases hold no raw data, so the report shows nothing the releases did not already publish.
"""

from __future__ import annotations

import glob
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa

from beam_dp.io import read_releases

__all__ = ["ACCURACY_KEYS", "ReportSummary", "load_releases", "make_report"]

log = logging.getLogger("beam_dp.report")

#: Meta keys read as model-snapshot accuracy, first numeric (or mapping of numbers) match wins.
ACCURACY_KEYS = ("accuracy", "average_accuracy", "snapshot_accuracy", "test_accuracy")
#: Columns every release row has (``beam_dp.io.RELEASE_SCHEMA``) that the report reads.
REQUIRED_COLUMNS = ("stream", "step", "mechanism", "value", "epsilon_spent", "delta_spent", "epsilon_budget", "meta")


@dataclass
class ReportSummary:
    files: int = 0
    rows: int = 0
    streams: int = 0
    mechanisms: list = field(default_factory=list)
    last_step: int = 0
    dead_letters: int | None = None
    figures: list = field(default_factory=list)

    def line(self) -> str:
        dead = "unknown (no dead-letter files)" if self.dead_letters is None else str(self.dead_letters)
        return (f"beam_dp report: {self.rows} release rows from {self.files} files; {self.streams} streams, "
                f"steps released up to {self.last_step}, mechanisms {', '.join(self.mechanisms)}; "
                f"dead letters: {dead}; figures: {', '.join(self.figures)}")


def _paths(patterns: Iterable[str]) -> list[str]:
    paths: list[str] = []
    for pattern in patterns:
        found = sorted(glob.glob(pattern)) or sorted(glob.glob(pattern + "*"))
        paths.extend(p for p in found if Path(p).is_file() and not Path(p).name.startswith("dead_letter"))
    if not paths:
        raise FileNotFoundError(f"no release files match {' '.join(patterns)}")
    return paths


def load_releases(patterns: Iterable[str], progress_every: float = 5.0) -> tuple[list[dict], int]:
    """All rows of the matching files, logging progress every ``progress_every`` seconds (long replays)."""
    paths = _paths(patterns)
    rows: list[dict] = []
    last = time.monotonic()
    for i, path in enumerate(paths, 1):
        rows.extend(_read_release_file(path))
        if time.monotonic() - last >= progress_every:
            log.info("read %d/%d files, %d rows", i, len(paths), len(rows))
            last = time.monotonic()
    return rows, len(paths)


def _read_release_file(path: str) -> list[dict]:
    """The rows of one release file; ``ValueError`` naming the file when it is not one."""
    try:
        rows = read_releases(path)
    except (ValueError, TypeError, KeyError, OSError, pa.ArrowException) as exc:
        raise ValueError(f"{path} is not a beam_dp release file (Parquet or JSON lines of release rows): "
                         f"{type(exc).__name__}") from None
    for row in rows:
        missing = [c for c in REQUIRED_COLUMNS if c not in row]
        if missing or not isinstance(row["meta"], dict):
            raise ValueError(f"{path} is not a beam_dp release file: its rows lack {', '.join(missing) or 'a meta mapping'}")
    return rows


def _count_dead_letters(pattern: str | None, release_paths: list[str]) -> int | None:
    if pattern is None:
        folders = {str(Path(p).parent) for p in release_paths}
        files = sorted(f for d in folders for f in glob.glob(str(Path(d) / "dead_letter*")))
    else:
        files = sorted(glob.glob(pattern))
    if not files:
        return None
    return sum(1 for f in files for line in Path(f).read_text(encoding="utf-8").splitlines() if line.strip())


def _first_coordinate(row: dict) -> float:
    value = row["value"]
    return float(value[0]) if len(value) else float("nan")


def _noise_std(row: dict) -> float:
    """Per-coordinate standard deviation of the release error; NaN where the release does not say."""
    meta = row["meta"]
    std = meta.get("noise_std")
    if std is not None:
        return float(np.ravel(std)[0])
    scale, law = meta.get("noise_scale"), meta.get("law")
    if isinstance(scale, (int, float)) and law == "gaussian":
        return float(scale)
    if isinstance(scale, (int, float)) and law == "gamma":  # K-norm in d dims: variance (d + 1)·b² per coordinate
        return float(np.sqrt(len(row["value"]) + 1) * scale)
    return float("nan")


def _accuracy(meta: dict) -> float | None:
    """The first accuracy in ``meta`` (a number, or the mean of a mapping of per-task numbers)."""
    for key in ACCURACY_KEYS:
        value = meta.get(key)
        if isinstance(value, dict):
            numbers = [v for v in value.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if numbers:
                return float(np.mean(numbers))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _by_stream(rows: list[dict], streams: list[str]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {s: [] for s in streams}
    for row in rows:
        if row["stream"] in out:
            out[row["stream"]].append(row)
    for series in out.values():
        series.sort(key=lambda r: r["step"])
    return out


def make_report(patterns: Iterable[str], out_dir: str | Path, dead_letters: str | None = None,
                max_streams: int = 6, band: float = 2.0) -> ReportSummary:
    """Write the figures and ``summary.json`` to ``out_dir``; return the summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if max_streams < 1 or not band > 0:
        raise ValueError("--max-streams must be >= 1 and --band > 0")
    patterns = list(patterns)
    rows, n_files = load_releases(patterns)
    if not rows:
        raise ValueError("the release files hold no rows")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    all_streams = sorted({r["stream"] for r in rows})
    streams = all_streams[:max_streams]
    mechanisms = sorted({r["mechanism"] for r in rows})
    summary = ReportSummary(files=n_files, rows=len(rows), streams=len(all_streams), mechanisms=mechanisms,
                            last_step=max(r["step"] for r in rows),
                            dead_letters=_count_dead_letters(dead_letters, _paths(patterns)))

    for mechanism in mechanisms:
        series = _by_stream([r for r in rows if r["mechanism"] == mechanism], streams)
        fig, ax = plt.subplots(figsize=(9, 4.5))
        banded = unbanded = 0
        for stream, srows in series.items():
            if not srows:
                continue
            steps = np.array([r["step"] for r in srows])
            values = np.array([_first_coordinate(r) for r in srows])
            std = np.array([_noise_std(r) for r in srows])
            (line,) = ax.plot(steps, values, label=stream, lw=1.2)
            known = np.isfinite(std)
            banded += int(known.sum())
            unbanded += int((~known).sum())
            if known.any():
                ax.fill_between(steps, values - band * std, values + band * std, where=known,
                                color=line.get_color(), alpha=0.25, label=f"{stream} ±{band:g}·noise std")
        ax.set_xlabel("step")
        ax.set_ylabel("released value (first coordinate)")
        ax.set_title(f"{mechanism}: " + (f"releases with ±{band:g}·noise std bands" if banded and not unbanded else
                                         f"releases, ±{band:g}·noise std bands where the meta gives it" if banded else
                                         "releases (no noise std in the release meta: no band)"))
        ax.legend(fontsize="small", ncol=2)
        name = f"values_{mechanism}.png"
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        summary.figures.append(name)

    fig, ax = plt.subplots(figsize=(9, 4.5))
    has_delta = any(r["delta_spent"] > 0 for r in rows)
    ax2 = ax.twinx() if has_delta else None
    for (stream, mechanism), srows in sorted(_group(rows, streams).items()):
        steps = [r["step"] for r in srows]
        (line,) = ax.step(steps, [r["epsilon_spent"] for r in srows], where="post", label=f"{stream} ({mechanism})")
        if ax2 is not None:
            ax2.step(steps, [r["delta_spent"] for r in srows], where="post", ls=":", color=line.get_color())
    for budget in sorted({r["epsilon_budget"] for r in rows}):
        ax.axhline(budget, ls="--", color="grey", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("epsilon_spent (worst case per element)")
    if ax2 is not None:
        ax2.set_ylabel("delta_spent (dotted)")
    ax.set_title("privacy spend per stream (dashed: budget)")
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(out / "privacy_spend.png", dpi=110)
    plt.close(fig)
    summary.figures.append("privacy_spend.png")

    accuracy_rows = [r for r in rows if _accuracy(r["meta"]) is not None]
    if accuracy_rows:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        for (stream, mechanism), srows in sorted(_group(accuracy_rows, streams).items()):
            ax.plot([r["step"] for r in srows], [_accuracy(r["meta"]) for r in srows], marker=".",
                    label=f"{stream} ({mechanism})")
        ax.set_xlabel("step")
        ax.set_ylabel("model-snapshot accuracy")
        ax.set_title("accuracy of released model snapshots (from release meta)")
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(out / "accuracy.png", dpi=110)
        plt.close(fig)
        summary.figures.append("accuracy.png")

    (out / "summary.json").write_text(json.dumps(asdict(summary), indent=2) + "\n")
    return summary


def _group(rows: list[dict], streams: list[str]) -> dict[tuple[str, str], list[dict]]:
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        if row["stream"] in streams:
            groups.setdefault((row["stream"], row["mechanism"]), []).append(row)
    for series in groups.values():
        series.sort(key=lambda r: r["step"])
    return groups
