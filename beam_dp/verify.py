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

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_dp.core.budget import COMPOSITIONS, compose

__all__ = ["VERIFIED_COLUMNS", "DomainSpend", "JobVerdict", "main", "verify_job"]

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


def _strings(table: pa.Table, name: str) -> np.ndarray:
    return pc.fill_null(table.column(name), "").to_numpy(zero_copy_only=False).astype(object)


def verify_job(rows: Iterable[Mapping] | pa.Table, epsilon: float | None = None, delta: float | None = None) -> JobVerdict:
    """Recompute a job's worst per-contribution loss from its release rows, or a table of them with the
    columns of ``beam_dp.io.RELEASE_SCHEMA`` (see the module docstring). Columnar: one pass of array
    operations, so a job's millions of releases verify in seconds."""
    table = rows if isinstance(rows, pa.Table) else _table_of(rows)
    problems: list[str] = []
    domain, composition = _strings(table, "noise_domain"), _strings(table, "composition")
    number = {name: np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)
              for name in VERIFIED_COLUMNS[6:]}

    def where(i: int) -> str:
        return f"release (stream {table.column('stream')[i].as_py()!r}, step {table.column('step')[i].as_py()})"

    labelled = (domain != "") & np.isin(composition, COMPOSITIONS)
    problems += [f"{where(i)} has no noise domain or composition: not written by a domain-aware beam_dp"
                 for i in np.flatnonzero(~labelled)]
    keyed = table.filter(pa.array(labelled)).select(["noise_domain", "stream", "step", "mechanism", "meta"])
    counts = keyed.append_column("_n", pa.array(np.ones(keyed.num_rows, np.int64))).group_by(
        ["noise_domain", "stream", "step", "mechanism", "meta"]).aggregate([("_n", "sum")])
    for dup in counts.filter(pc.greater(counts.column("_n_sum"), 1)).to_pylist():
        problems.append(f"release (stream {dup['stream']!r}, step {dup['step']}) of {dup['noise_domain']!r} appears "
                        f"{dup['_n_sum']} times: two transforms share the noise domain")
    eps, dlt, eps_budget, dlt_budget = (number[n] for n in ("epsilon_spent", "delta_spent", "epsilon_budget",
                                                             "delta_budget"))
    with np.errstate(invalid="ignore"):
        valid = labelled & np.isfinite(eps) & (eps >= 0) & (dlt >= 0) & (dlt < 1)
        over = valid & ((eps > eps_budget * (1 + _TOL)) | (dlt > dlt_budget * (1 + _TOL)))
    problems += [f"{where(i)} of {domain[i]!r} reports an invalid spend ({eps[i]}, {dlt[i]})"
                 for i in np.flatnonzero(labelled & ~valid)]
    problems += [f"{where(i)} of {domain[i]!r} spends ({eps[i]:.6g}, {dlt[i]:.3g}), more than its own budget "
                 f"({eps_budget[i]:.6g}, {dlt_budget[i]:.3g})" for i in np.flatnonzero(over)]
    spent: list[DomainSpend] = []
    for name in sorted(set(domain[labelled])):
        rows_of = np.flatnonzero(labelled & (domain == name))
        first = rows_of[0]
        agree = (composition[rows_of] == composition[first]) & (eps_budget[rows_of] == eps_budget[first]) & (
            dlt_budget[rows_of] == dlt_budget[first])
        problems += [f"{where(i)} of {name!r} disagrees with the domain's other releases about its budget or "
                     "composition" for i in rows_of[~agree]]
        ok = rows_of[valid[rows_of]]
        spent.append(DomainSpend(name, composition[first], float(eps[ok].max(initial=0.0)),
                                 float(dlt[ok].max(initial=0.0)), float(eps_budget[first]), float(dlt_budget[first]),
                                 len(ok)))
    declared = sorted(set(zip(number["job_epsilon_budget"][valid].tolist(), number["job_delta_budget"][valid].tolist())))
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m beam_dp.verify",
        description="Recompute a job's worst per-contribution privacy loss from its release files and check it "
                    "against the declared total.")
    parser.add_argument("paths", nargs="+", help="release files (Parquet or JSON lines): globs or file prefixes")
    parser.add_argument("--epsilon", type=float, default=None, help="the job's declared total epsilon")
    parser.add_argument("--delta", type=float, default=None, help="the job's declared total delta")
    args = parser.parse_args(argv)
    from beam_dp.io.readers import read_release_table

    try:
        table = pa.concat_tables([read_release_table(path, VERIFIED_COLUMNS) for path in args.paths])
    except (OSError, ValueError, pa.ArrowInvalid) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    verdict = verify_job(table, args.epsilon, args.delta)
    print(verdict.describe())
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
