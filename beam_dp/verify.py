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
import math
import sys
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from beam_dp.core.budget import COMPOSITIONS, compose

__all__ = ["DomainSpend", "JobVerdict", "main", "verify_job"]

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


def verify_job(rows: Iterable[Mapping], epsilon: float | None = None, delta: float | None = None) -> JobVerdict:
    """Recompute a job's worst per-contribution loss from its release rows (see the module docstring)."""
    domains: dict[str, DomainSpend] = {}
    declared: set[tuple[float, float]] = set()
    seen: set[tuple] = set()
    problems: list[str] = []
    for row in rows:
        domain, composition = row.get("noise_domain") or "", row.get("composition") or ""
        where = f"release (stream {row.get('stream')!r}, step {row.get('step')})"
        if not domain or composition not in COMPOSITIONS:
            problems.append(f"{where} has no noise domain or composition: not written by a domain-aware beam_dp")
            continue
        meta = row.get("meta")
        identity = (domain, row["stream"], row["step"], row["mechanism"],
                    meta if isinstance(meta, str) else json.dumps(meta, sort_keys=True))
        if identity in seen:
            problems.append(f"{where} of {domain!r} appears twice: two transforms share the noise domain")
        seen.add(identity)
        spend = domains.setdefault(domain, DomainSpend(domain, composition, epsilon_budget=row["epsilon_budget"],
                                                       delta_budget=row["delta_budget"]))
        if (composition, row["epsilon_budget"], row["delta_budget"]) != (
                spend.composition, spend.epsilon_budget, spend.delta_budget):
            problems.append(f"{where} of {domain!r} disagrees with the domain's other releases about its budget "
                            "or composition")
        eps, dlt = float(row["epsilon_spent"]), float(row["delta_spent"])
        if not (math.isfinite(eps) and eps >= 0 and 0 <= dlt < 1):
            problems.append(f"{where} of {domain!r} reports an invalid spend ({eps}, {dlt})")
            continue
        if eps > row["epsilon_budget"] * (1 + _TOL) or dlt > row["delta_budget"] * (1 + _TOL):
            problems.append(f"{where} of {domain!r} spends ({eps:.6g}, {dlt:.3g}), more than its own budget "
                            f"({row['epsilon_budget']:.6g}, {row['delta_budget']:.3g})")
        spend.epsilon_spent, spend.delta_spent = max(spend.epsilon_spent, eps), max(spend.delta_spent, dlt)
        spend.releases += 1
        declared.add((float(row.get("job_epsilon_budget", 0.0)), float(row.get("job_delta_budget", 0.0))))
    if epsilon is None or delta is None:
        if len(declared) != 1:
            problems.append(f"the releases declare {len(declared)} different job totals {sorted(declared)}; "
                            "pass --epsilon and --delta")
            found = max(declared) if declared else (0.0, 0.0)
        else:
            found = next(iter(declared))
        epsilon = found[0] if epsilon is None else epsilon
        delta = found[1] if delta is None else delta
    spent = sorted(domains.values(), key=lambda d: d.domain)
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
    from beam_dp.io.readers import read_releases

    rows: list[dict] = []
    try:
        for path in args.paths:
            rows.extend(read_releases(path))
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    verdict = verify_job(rows, args.epsilon, args.delta)
    print(verdict.describe())
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
