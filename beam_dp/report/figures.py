"""Report figures from release files (any mechanism: one schema, ``beam_dp.io.ReleaseRow``).

The releases are read once, an Arrow batch at a time (:mod:`beam_dp.report.aggregate`): totals and
the per-step spend over every release, the rows of the drawn streams only (per mechanism, the first
``max_streams`` stream names in sorted order). Each figure's title and caption say how many streams
it draws of how many there are, and which.

* ``values_<mechanism>.png``: the released value (first coordinates; for mapping-valued releases,
  the first part) per step of each drawn stream, with a band of ``± band × noise std``: the
  per-coordinate standard deviation of the release error, ``meta["noise_std"]`` where the mechanism
  reports it, or derived from an output-perturbed model's ``law``/``noise_scale`` (Gaussian: σ;
  K-norm in d dimensions: √(d+1)·b). Releases without either (projected or post-processed models)
  are drawn without a band, and the title says so;
* ``privacy_spend.png``: per mechanism and step, over every stream, the largest ``epsilon_spent``
  (the shading reaches down to the smallest) and the largest ``delta_spent`` when non-zero, with the
  budgets as dashed lines;
* ``accuracy.png``: where a drawn stream's release meta has an accuracy (e.g. model-snapshot
  accuracy; a mapping of per-task accuracies, as lifelong snapshots carry, is drawn as their mean),
  per step;
* ``summary.json`` and the summary lines: rows read, streams, steps released, dead letters, each
  figure's caption.

Releases hold no raw data, so the report shows nothing the releases did not already publish.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from beam_dp.report.aggregate import (
    ACCURACY_KEYS,
    DrawnSeries,
    MechanismAggregate,
    ReleaseAggregate,
    accuracy,
    aggregate_files,
    noise_std,
)
from beam_dp.report.progress import ReadProgress
from beam_dp.report.sources import ReportInputError, release_files

__all__ = ["ACCURACY_KEYS", "ReportSummary", "accuracy", "drawn_caption", "make_report", "noise_std"]

_NAMES_IN_CAPTION = 6


@dataclass
class ReportSummary:
    """What the report read and drew (``summary.json``)."""

    files: int = 0
    rows: int = 0
    streams: int = 0
    mechanisms: list = field(default_factory=list)
    last_step: int = 0
    dead_letters: int | None = None
    figures: list = field(default_factory=list)
    streams_by_mechanism: dict = field(default_factory=dict)
    drawn: dict = field(default_factory=dict)  # mechanism -> the streams its figures draw
    captions: dict = field(default_factory=dict)  # figure -> its caption
    notes: list = field(default_factory=list)

    def line(self) -> str:
        dead = "unknown (no dead-letter files)" if self.dead_letters is None else str(self.dead_letters)
        drawn = max((len(d) for d in self.drawn.values()), default=0)
        return (f"beam_dp report: {self.rows} release rows from {self.files} files; {self.streams} streams, "
                f"steps released up to {self.last_step}, mechanisms {', '.join(self.mechanisms)}; "
                f"dead letters: {dead}; figures: {', '.join(self.figures)} (drawing {drawn} of {self.streams} "
                "streams, first by name)")

    def lines(self) -> list[str]:
        """The summary line, then one line per figure (its caption) and per note."""
        return ([self.line()] + [f"  {name}: {self.captions[name]}" for name in self.figures]
                + [f"  note: {note}" for note in self.notes])


def drawn_caption(drawn: list[str], total: int) -> str:
    """``"k of N streams drawn (first k by name: a, b, ...)"``."""
    names = ", ".join(drawn[:_NAMES_IN_CAPTION]) + (", ..." if len(drawn) > _NAMES_IN_CAPTION else "")
    return f"{len(drawn)} of {total} streams drawn (the first {len(drawn)} by name: {names})"


def _count_dead_letters(pattern: str | None, release_paths: list[str]) -> int | None:
    """Non-blank lines of the dead-letter files (``pattern``, else ``dead_letter*`` beside the releases)."""
    from apache_beam.io.filesystems import FileSystems

    from beam_dp.report.sources import _match

    if pattern is None:
        folders = sorted({p.rsplit("/", 1)[0] if "/" in p else "." for p in release_paths})
        files = sorted(f for d in folders for f in _match(FileSystems.join(d, "dead_letter*")))
    else:
        files = _match(pattern)
    if not files:
        return None
    count = 0
    for path in files:
        try:
            with FileSystems.open(path) as fh:
                count += sum(1 for line in fh if line.strip())
        except OSError as exc:
            raise ReportInputError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    return count


def _output_folder(out_dir: str | Path) -> Path:
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ReportInputError(f"--out {out} is an existing file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportInputError(f"cannot create --out {out}: {exc.strerror or type(exc).__name__}") from None
    return out


def _save(plt, fig, out: Path, name: str, caption: str, summary: ReportSummary) -> None:
    fig.text(0.01, 0.01, caption, fontsize="small", ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    summary.figures.append(name)
    summary.captions[name] = caption


def _values_figure(plt, mechanism: MechanismAggregate, series: list[DrawnSeries], band: float):
    fig, ax = plt.subplots(figsize=(9, 4.8))
    banded = unbanded = 0
    for s in series:
        std = s.noise_std
        (line,) = ax.plot(s.steps, s.first, label=s.stream, lw=1.2)
        known = np.isfinite(std)
        banded += int(known.sum())
        unbanded += int((~known).sum())
        if known.any():
            ax.fill_between(s.steps, s.first - band * std, s.first + band * std, where=known,
                            color=line.get_color(), alpha=0.25, label=f"{s.stream} ±{band:g}·noise std")
    ax.set_xlabel("step")
    ax.set_ylabel("released value (first coordinate)")
    bands = (f"±{band:g}·noise std bands" if banded and not unbanded else
             f"±{band:g}·noise std bands where the meta gives it" if banded else
             "no noise std in the release meta: no band")
    ax.set_title(f"{mechanism.name}: releases of {len(mechanism.drawn)} of {len(mechanism.streams)} streams, {bands}",
                 fontsize="medium")
    ax.legend(fontsize="small", ncol=2)
    return fig


def _spend_figure(plt, aggregate: ReleaseAggregate):
    fig, ax = plt.subplots(figsize=(9, 4.8))
    ax2 = ax.twinx() if aggregate.has_delta else None
    for mechanism in aggregate.mechanisms.values():
        spend = mechanism.spend
        (line,) = ax.step(spend.steps, spend.epsilon_max, where="post",
                          label=f"{mechanism.name} (largest of {len(mechanism.streams)} streams)")
        if np.any(spend.epsilon_min < spend.epsilon_max):
            ax.fill_between(spend.steps, spend.epsilon_min, spend.epsilon_max, step="post", color=line.get_color(),
                            alpha=0.2)
        if ax2 is not None:
            ax2.step(spend.steps, spend.delta_max, where="post", ls=":", color=line.get_color())
    for budget in sorted(set().union(*(m.epsilon_budgets for m in aggregate.mechanisms.values()))):
        ax.axhline(budget, ls="--", color="grey", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("epsilon_spent (worst case per element)")
    if ax2 is not None:
        ax2.set_ylabel("delta_spent (dotted, largest)")
    ax.set_title(f"privacy spend per step over all {aggregate.stream_count()} streams (dashed: budget)",
                 fontsize="medium")
    ax.legend(fontsize="small", ncol=2)
    return fig


def _accuracy_figure(plt, drawn: dict[str, list[DrawnSeries]]):
    points = {(m, s.stream): (s.steps[known], s.accuracy[known])
              for m, series in drawn.items() for s in series if (known := np.isfinite(s.accuracy)).any()}
    if not points:
        return None, []
    fig, ax = plt.subplots(figsize=(9, 4.8))
    for (mechanism, stream), (steps, values) in sorted(points.items()):
        ax.plot(steps, values, marker=".", label=f"{stream} ({mechanism})")
    ax.set_xlabel("step")
    ax.set_ylabel("model-snapshot accuracy")
    ax.legend(fontsize="small")
    return fig, sorted({m for m, _ in points})


def make_report(patterns: Iterable[str], out_dir: str | Path, dead_letters: str | None = None,
                max_streams: int = 6, band: float = 2.0, progress: bool = True) -> ReportSummary:
    """Write the figures and ``summary.json`` of the releases that ``patterns`` name (job folders,
    globs, file prefixes or files: :func:`beam_dp.report.sources.release_files`) to ``out_dir``;
    return the summary.

    Args:
        patterns: the inputs.
        out_dir: folder for the figures (created; an existing file is a ``ReportInputError``).
        dead_letters: glob of dead-letter files to count; default ``dead_letter*`` beside the releases.
        max_streams: streams drawn per mechanism (the first by name).
        band: half-width of the noise band in standard deviations.
        progress: report the read's progress after a few seconds: on stderr when it is a terminal,
            otherwise as INFO lines of the ``beam_dp.report`` logger.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if max_streams < 1 or not band > 0:
        raise ReportInputError("--max-streams must be >= 1 and --band > 0")
    paths, notes = release_files(patterns)
    out = _output_folder(out_dir)
    reader = ReadProgress(len(paths)) if progress else None
    try:
        aggregate = aggregate_files(paths, max_streams, reader)
    finally:
        if reader is not None:
            reader.close()
    if not aggregate.rows:
        raise ReportInputError("the release files hold no rows")
    mechanisms = sorted(aggregate.mechanisms)
    drawn = {name: aggregate.mechanisms[name].series() for name in mechanisms}
    summary = ReportSummary(files=len(paths), rows=aggregate.rows, streams=aggregate.stream_count(),
                            mechanisms=mechanisms, last_step=aggregate.last_step,
                            dead_letters=_count_dead_letters(dead_letters, paths),
                            streams_by_mechanism={m: len(aggregate.mechanisms[m].streams) for m in mechanisms},
                            drawn={m: list(aggregate.mechanisms[m].drawn) for m in mechanisms}, notes=notes)

    for name in mechanisms:
        mechanism = aggregate.mechanisms[name]
        fig = _values_figure(plt, mechanism, drawn[name], band)
        _save(plt, fig, out, f"values_{name}.png", drawn_caption(mechanism.drawn, len(mechanism.streams)), summary)

    fig = _spend_figure(plt, aggregate)
    _save(plt, fig, out, "privacy_spend.png",
          f"all {aggregate.rows} releases of {summary.streams} streams: per step the largest epsilon_spent of any "
          "stream (line), shaded down to the smallest", summary)

    fig, with_accuracy = _accuracy_figure(plt, drawn)
    if fig is not None:
        caption = "; ".join(f"{m}: {drawn_caption(aggregate.mechanisms[m].drawn, len(aggregate.mechanisms[m].streams))}"
                            for m in with_accuracy)
        fig.axes[0].set_title("accuracy of released model snapshots (from release meta) of the drawn streams",
                              fontsize="medium")
        _save(plt, fig, out, "accuracy.png", caption, summary)

    (out / "summary.json").write_text(json.dumps(asdict(summary), indent=2) + "\n")
    return summary
