"""Verify a whole job's privacy spend from its written release files.

``verify_job(rows, epsilon=None, delta=None)`` recomputes, from the releases alone, the worst
per-contribution loss across every transform (noise domain) of a job and compares it with the job's
declared total: for each domain it takes the largest ``epsilon_spent`` any release reports (a
transform's spend is the worst loss of any contribution so far, and never decreases), then composes
the domains with the rules of ``beam_dp.core.budget.compose`` at the job's ``delta``. It also fails
on a release that reports more than its own budget, on a domain whose releases disagree about their
budget or composition, on a release without a noise domain, and on a (domain, stream, step,
mechanism, meta) seen twice (what two transforms sharing a domain would write).

Command line::

    python -m beam_dp.verify 'output/demo/*.parquet' [--epsilon 1 --delta 0]

exits 0 when the job is within its total, 1 when it is not (the reasons are printed), 2 on bad usage.
Without ``--epsilon``/``--delta`` the declared total is read from the releases' ``job_*_budget``
columns, which must agree.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_dp.core.budget import COMPOSITIONS, compose

__all__ = ["VERIFIED_COLUMNS", "DomainSpend", "JobVerdict", "JobVerifier", "main", "verify_job"]

_TOL = 1e-9


@dataclass
class DomainSpend:
    """What one transform (noise domain) reports: its worst spend, budget and composition."""

    domain: str
    composition: str
    epsilon_spent: float = 0.0
    delta_spent: float = 0.0
    epsilon_budget: float = 0.0
    delta_budget: float = 0.0
    releases: int = 0


@dataclass
class JobVerdict:
    """The recomputed worst loss of the job against its declared total; ``problems`` empty = verified."""

    epsilon: float
    delta: float
    worst_epsilon: float
    domains: list[DomainSpend]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        lines = [f"job total: epsilon {self.epsilon:g}, delta {self.delta:g}; worst contribution across "
                 f"{len(self.domains)} transform(s): epsilon {self.worst_epsilon:.6g}"]
        for d in self.domains:
            lines.append(f"  {d.domain}: {d.composition}, spent ({d.epsilon_spent:.6g}, {d.delta_spent:.3g}) of "
                         f"({d.epsilon_budget:.6g}, {d.delta_budget:.3g}) over {d.releases} releases")
        lines += [f"  PROBLEM: {p}" for p in self.problems]
        lines.append("verified: within the job's total" if self.ok else "NOT verified")
        return "\n".join(lines)


VERIFIED_COLUMNS = ("noise_domain", "composition", "stream", "step", "mechanism", "meta", "epsilon_spent", "delta_spent",
                    "epsilon_budget", "delta_budget", "job_epsilon_budget", "job_delta_budget")


def _table_of(rows: Iterable[Mapping]) -> pa.Table:
    """Release rows (dicts; ``meta`` a JSON string or a mapping) as the columns the verifier reads."""
    rows = list(rows)
    text = {"noise_domain", "composition", "mechanism", "meta"}
    columns = {name: [row.get(name) or ("" if name in text else 0.0) for row in rows] for name in VERIFIED_COLUMNS}
    columns["stream"] = [row.get("stream") for row in rows]
    columns["step"] = [row.get("step") for row in rows]
    columns["meta"] = [m if isinstance(m, str) else json.dumps(m, sort_keys=True) for m in columns["meta"]]
    return pa.table(columns)


class _Names:
    """Integer ids of the distinct strings of a column, batch after batch (the strings kept once)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []

    def __call__(self, column: "pa.ChunkedArray | pa.Array") -> np.ndarray:
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        encoded = pc.dictionary_encode(pc.fill_null(column, ""))
        distinct = encoded.dictionary.to_pylist()
        for name in distinct:
            if name not in self.ids:
                self.ids[name] = len(self.names)
                self.names.append(name)
        local = np.array([self.ids[name] for name in distinct], dtype=np.int64)
        return local[encoded.indices.to_numpy(zero_copy_only=False)]


@dataclass
class _Domain:
    composition: int
    epsilon_budget: float
    delta_budget: float
    epsilon_spent: float = 0.0
    delta_spent: float = 0.0
    releases: int = 0


_LOW32 = (1 << 32) - 1


def _packed_keys(domain: np.ndarray, stream: np.ndarray, step: np.ndarray, mechanism: np.ndarray, meta: np.ndarray,
                 rows: np.ndarray) -> np.ndarray:
    """The (domain, stream, step, mechanism, meta) key of each of ``rows`` as two uint64 words (16 bytes
    a release): domain and mechanism ids below 2^16, meta and stream ids below 2^32, steps in
    [-1, 2^32 − 2] (``ValueError`` beyond: no job comes near)."""
    domain, stream, step, mechanism, meta = (a[rows] for a in (domain, stream, step, mechanism, meta))
    if len(domain) and (domain.max() >= 1 << 16 or mechanism.max() >= 1 << 16 or meta.max() > _LOW32
                        or stream.max() > _LOW32 or step.min() < -1 or step.max() >= _LOW32):
        raise ValueError("too many distinct domains, mechanisms, metas or streams, or a step beyond 2^32, to verify")
    high = (domain.astype(np.uint64) << np.uint64(48)) | (mechanism.astype(np.uint64) << np.uint64(32)) | meta.astype(np.uint64)
    low = (stream.astype(np.uint64) << np.uint64(32)) | (step + 1).astype(np.uint64)
    return np.stack([high, low], axis=1)


class JobVerifier:
    """``verify_job`` one table of releases at a time (see the module docstring): per noise domain it
    keeps the worst spend, budget and composition, and per release 16 bytes of ids to find a release
    written twice, so a job's output of any size is checked with one batch of it in memory."""

    def __init__(self) -> None:
        self._domains, self._compositions, self._streams, self._mechanisms, self._metas = (
            _Names(), _Names(), _Names(), _Names(), _Names())
        self._spends: dict[int, _Domain] = {}
        self._keys: list[np.ndarray] = []
        self._declared: set[tuple[float, float]] = set()
        self.problems: list[str] = []
        self.rows = 0

    def add(self, table: "pa.Table | pa.RecordBatch") -> None:
        """Check one table of releases (the columns of :data:`VERIFIED_COLUMNS`)."""
        for batch in (table.to_batches(65_536) if isinstance(table, pa.Table) else [table]):
            self._add_batch(batch)

    def _add_batch(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        domain, composition = self._domains(batch.column("noise_domain")), self._compositions(batch.column("composition"))
        number = {name: np.asarray(batch.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)
                  for name in VERIFIED_COLUMNS[6:]}
        step = np.asarray(pc.fill_null(batch.column("step"), -1).to_numpy(zero_copy_only=False), dtype=np.int64)

        def where(i: int) -> str:
            return f"release (stream {batch.column('stream')[i].as_py()!r}, step {batch.column('step')[i].as_py()})"

        def name(i: int) -> str:
            return self._domains.names[domain[i]]

        labelled = (np.array([n != "" for n in self._domains.names], dtype=bool)[domain]
                    & np.array([n in COMPOSITIONS for n in self._compositions.names], dtype=bool)[composition])
        self.problems += [f"{where(i)} has no noise domain or composition: not written by a domain-aware beam_dp"
                          for i in np.flatnonzero(~labelled)]
        self._keys.append(_packed_keys(domain, self._streams(batch.column("stream")), step,
                                       self._mechanisms(batch.column("mechanism")), self._metas(batch.column("meta")),
                                       labelled))
        eps, dlt, eps_budget, dlt_budget = (number[n] for n in ("epsilon_spent", "delta_spent", "epsilon_budget",
                                                                 "delta_budget"))
        with np.errstate(invalid="ignore"):
            valid = labelled & np.isfinite(eps) & (eps >= 0) & (dlt >= 0) & (dlt < 1)
            over = valid & ((eps > eps_budget * (1 + _TOL)) | (dlt > dlt_budget * (1 + _TOL)))
        self.problems += [f"{where(i)} of {name(i)!r} reports an invalid spend ({eps[i]}, {dlt[i]})"
                          for i in np.flatnonzero(labelled & ~valid)]
        self.problems += [f"{where(i)} of {name(i)!r} spends ({eps[i]:.6g}, {dlt[i]:.3g}), more than its own budget "
                          f"({eps_budget[i]:.6g}, {dlt_budget[i]:.3g})" for i in np.flatnonzero(over)]
        for d in np.unique(domain[labelled]).tolist():
            rows_of = np.flatnonzero(labelled & (domain == d))
            first = rows_of[0]
            spend = self._spends.setdefault(d, _Domain(int(composition[first]), float(eps_budget[first]),
                                                       float(dlt_budget[first])))
            agree = (composition[rows_of] == spend.composition) & (eps_budget[rows_of] == spend.epsilon_budget) & (
                dlt_budget[rows_of] == spend.delta_budget)
            self.problems += [f"{where(i)} of {name(i)!r} disagrees with the domain's other releases about its budget "
                              "or composition" for i in rows_of[~agree]]
            ok = rows_of[valid[rows_of]]
            spend.epsilon_spent = max(spend.epsilon_spent, float(eps[ok].max(initial=0.0)))
            spend.delta_spent = max(spend.delta_spent, float(dlt[ok].max(initial=0.0)))
            spend.releases += len(ok)
        self._declared |= set(zip(number["job_epsilon_budget"][valid].tolist(), number["job_delta_budget"][valid].tolist()))

    def _duplicates(self) -> list[str]:
        keys = np.concatenate(self._keys) if self._keys else np.zeros((0, 2), np.uint64)
        if len(keys) < 2:
            return []
        keys = keys[np.lexsort((keys[:, 1], keys[:, 0]))]
        starts = np.flatnonzero(np.concatenate([[True], np.any(keys[1:] != keys[:-1], axis=1)]))
        runs = np.diff(np.append(starts, len(keys)))
        return [f"release (stream {self._streams.names[int(keys[i, 1] >> np.uint64(32))]!r}, step "
                f"{int(keys[i, 1] & np.uint64(_LOW32)) - 1}) of {self._domains.names[int(keys[i, 0] >> np.uint64(48))]!r} "
                f"appears {n} times: two transforms share the noise domain"
                for i, n in zip(starts[runs > 1].tolist(), runs[runs > 1].tolist())]

    def verdict(self, epsilon: float | None = None, delta: float | None = None) -> JobVerdict:
        """The job's verdict over every table added (the declared total read from the releases when
        ``epsilon``/``delta`` are not given)."""
        problems = self.problems + self._duplicates()
        spent = sorted((DomainSpend(self._domains.names[d], self._compositions.names[s.composition], s.epsilon_spent,
                                    s.delta_spent, s.epsilon_budget, s.delta_budget, s.releases)
                        for d, s in self._spends.items()), key=lambda d: d.domain)
        declared = sorted(self._declared)
        if epsilon is None or delta is None:
            if len(declared) != 1:
                problems.append(f"the releases declare {len(declared)} different job totals {declared}; "
                                "pass --epsilon and --delta")
            found = declared[-1] if declared else (0.0, 0.0)
            epsilon = found[0] if epsilon is None else epsilon
            delta = found[1] if delta is None else delta
        worst = compose(((d.composition, d.epsilon_spent, d.delta_spent) for d in spent), delta) if spent else 0.0
        if worst > epsilon * (1 + 1e-7):
            problems.append(f"the worst contribution spends epsilon {worst:.6g} at delta {delta:g} across the job's "
                            f"transforms, more than the declared total {epsilon:g}")
        if not spent and not problems:
            problems.append("no releases")
        return JobVerdict(float(epsilon), float(delta), float(worst), spent, problems)


def verify_job(rows: "Iterable[Mapping] | pa.Table | Iterable[pa.Table]", epsilon: float | None = None,
               delta: float | None = None) -> JobVerdict:
    """Recompute a job's worst per-contribution loss from its release rows, a table of them with the
    columns of ``beam_dp.io.RELEASE_SCHEMA``, or an iterable of such tables (e.g.
    ``beam_dp.io.iter_release_tables``; see the module docstring). Columnar: array operations one
    batch at a time, so a job's millions of releases verify in seconds and flat memory."""
    verifier = JobVerifier()
    if isinstance(rows, pa.Table):
        verifier.add(rows)
    else:
        items = iter(rows)
        first = next(items, None)
        if isinstance(first, (pa.Table, pa.RecordBatch)):
            verifier.add(first)
            for table in items:
                verifier.add(table)
        elif first is not None:
            verifier.add(_table_of([first, *items]))
    return verifier.verdict(epsilon, delta)


def main(argv: list[str] | None = None) -> int:
    from beam_dp.cli import OneLineParser, guarded

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = OneLineParser(
        prog="python -m beam_dp.verify",
        description="Recompute a job's worst per-contribution privacy loss from its release files and check it "
                    "against the declared total.")
    parser.add_argument("paths", nargs="+", help="release files (Parquet or JSON lines): globs or file prefixes")
    parser.add_argument("--epsilon", type=float, default=None, help="the job's declared total epsilon")
    parser.add_argument("--delta", type=float, default=None, help="the job's declared total delta")
    parser.add_argument("--verbose", action="store_true", help="show the traceback of an unexpected failure")
    args = parser.parse_args(argv)
    return guarded(parser.prog, args.verbose, lambda: _verify(args), (OSError, ValueError, pa.ArrowInvalid))


def _verify(args) -> int:
    from beam_dp.io.readers import iter_release_tables

    verifier = JobVerifier()
    for path in args.paths:
        for table in iter_release_tables(path, VERIFIED_COLUMNS):
            verifier.add(table)
    verdict = verifier.verdict(args.epsilon, args.delta)
    print(verdict.describe())
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
