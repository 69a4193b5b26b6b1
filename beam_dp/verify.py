"""Verify a whole job's privacy spend from its written release files.

``verify_job(rows, epsilon=None, delta=None)`` recomputes, from the releases alone, the worst
per-contribution loss across every transform (noise domain) of a job and compares it with the job's
declared total: for each domain it takes the largest ``epsilon_spent`` any release reports (a
transform's spend is the worst loss of any contribution so far, and never decreases), then composes
the domains with the rules of ``beam_dp.core.budget.compose`` at the job's ``delta``. It also fails
on a release that reports more than its own budget, on a domain whose releases disagree about their
budget, composition or mechanism, on a release without a noise domain, on a ``"pure"`` domain that
reports a delta > 0, and on a (domain, stream, step, purpose) seen twice: a noise domain writes one
release per stream, step and purpose (``purpose`` is written by the mechanism, ``""`` for a step's one
release), so two transforms sharing a domain are flagged whatever their ``mechanism`` or ``meta``.

With the job's manifest (``beam_dp.io.manifest``, ``_beam_dp_manifest.json`` beside the releases) it
also fails when a declared transform has no release files or no releases, when a release's domain is
not declared, when the declared shares compose above the declared total, and when the rows' budget,
composition, mechanism or job total differ from the manifest; the manifest's total is then the job's
total, and a declared transform without releases is charged its whole share.

Command line::

    python -m beam_dp.verify output/demo                            # a job's folder: its manifest
    python -m beam_dp.verify 'output/demo/*.parquet' [--manifest output/demo] [--epsilon 1 --delta 0]

exits 0 when the job is within its total, 1 when it is not (the reasons are printed), 2 on bad usage.
Every release must declare its noise (a release that declares none fails); ``--lenient`` accepts such
releases (outputs of versions before every family declared), using their stated spend as a note.
Without a manifest or ``--epsilon``/``--delta`` the declared total is read from the releases'
``job_*_budget`` columns, which must agree.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_dp.core.budget import COMPOSITIONS, compose
from beam_dp.core.noise_declaration import loss_of_declaration, recomputed_epsilon
from beam_dp.io.manifest import JobManifest

__all__ = ["VERIFIED_COLUMNS", "DomainSpend", "JobVerdict", "JobVerifier", "main", "verify_job"]

_TOL = 1e-9
# a stated spend may sit this far (relative) below the one recomputed from its noise declaration: float
# rounding of the two arithmetics (~1e-15) and the analytic-Gaussian bisections (rel. 1e-12); a
# doctored spend is off by far more
_RECOMPUTE_TOL = 1e-7
#: mechanisms whose every release declares its noise: a release of theirs without one was stripped
DECLARING_MECHANISMS = frozenset({"kary_tree", "honaker_tree", "binary_tree", "hybrid_tree", "doubling_tree",
                                  "window_tree", "blt", "toeplitz_sqrt",
                                  # ERM model release (beam_dp.mechanisms.erm)
                                  "erm_continual", "erm_sliding_window", "erm_multires", "multires_sampled",
                                  # growing databases (accounts "pmwg", "bbscheduler", "bbimprover")
                                  "pmwg", "pmwg_synthetic", "bbscheduler", "bbscheduler_run", "bbscheduler_synthetic",
                                  "bbimprover", "bbimprover_run", "bbimprover_synthetic",
                                  # lifelong learners and incremental regression
                                  "naive_gaussian", "dpsgd_agem_bounded", "l2dp_ml",
                                  "privincreg1", "privincreg2", "privincerm"})


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
    mechanism: str = ""  # the mechanism family (``mechanism_family``) of its releases


@dataclass
class JobVerdict:
    """The recomputed worst loss of the job against its declared total; ``problems`` empty = verified."""

    epsilon: float
    delta: float
    worst_epsilon: float
    domains: list[DomainSpend]
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # facts that do not fail verification

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        lines = [f"job total: epsilon {self.epsilon:g}, delta {self.delta:g}; worst contribution across "
                 f"{len(self.domains)} transform(s): epsilon {self.worst_epsilon:.6g}"]
        for d in self.domains:
            lines.append(f"  {d.domain}: {d.composition}, spent ({d.epsilon_spent:.6g}, {d.delta_spent:.3g}) of "
                         f"({d.epsilon_budget:.6g}, {d.delta_budget:.3g}) over {d.releases} releases")
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  PROBLEM: {p}" for p in self.problems]
        lines.append("verified: within the job's total" if self.ok else "NOT verified")
        return "\n".join(lines)


VERIFIED_COLUMNS = ("noise_domain", "composition", "stream", "step", "mechanism", "meta", "epsilon_spent", "delta_spent",
                    "epsilon_budget", "delta_budget", "job_epsilon_budget", "job_delta_budget", "purpose", "noise")
_NUMBERS = ("epsilon_spent", "delta_spent", "epsilon_budget", "delta_budget", "job_epsilon_budget", "job_delta_budget")
#: suffixes of the extra releases a mechanism makes under its own name (``pmwg_synthetic``, ``mwem_run``)
_EXTRA_RELEASES = ("_synthetic", "_run")


def mechanism_family(name: str) -> str:
    """The mechanism a release name belongs to (``pmwg_synthetic`` -> ``pmwg``): one per noise domain."""
    for suffix in _EXTRA_RELEASES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _table_of(rows: Iterable[Mapping]) -> pa.Table:
    """Release rows (dicts; ``meta`` a JSON string or a mapping) as the columns the verifier reads."""
    rows = list(rows)
    text = {"noise_domain", "composition", "mechanism", "meta", "purpose", "noise"}
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
    family: str
    epsilon_budget: float
    delta_budget: float
    epsilon_spent: float = 0.0
    delta_spent: float = 0.0
    releases: int = 0
    pure_delta: bool = False  # a "pure" release reported a delta: composed as "approx" (and flagged)


_LOW32 = (1 << 32) - 1
_PURPOSE_BITS = 40


def _packed_keys(domain: np.ndarray, purpose: np.ndarray, stream: np.ndarray, step: np.ndarray,
                 rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (domain, purpose, stream, step) key of each of ``rows`` as two uint64 words, ``(high, low)``
    (16 bytes a release): domain ids below 2^24, purpose ids below 2^40, stream ids below 2^32, steps in
    [-1, 2^32 − 2] (``ValueError`` beyond: no job comes near)."""
    domain, purpose, stream, step = (a[rows] for a in (domain, purpose, stream, step))
    if len(domain) and (domain.max() >= 1 << (64 - _PURPOSE_BITS) or purpose.max() >= 1 << _PURPOSE_BITS
                        or stream.max() > _LOW32 or step.min() < -1 or step.max() >= _LOW32):
        raise ValueError("too many distinct domains, purposes or streams, or a step beyond 2^32, to verify")
    high = (domain.astype(np.uint64) << np.uint64(_PURPOSE_BITS)) | purpose.astype(np.uint64)
    low = (stream.astype(np.uint64) << np.uint64(32)) | (step + 1).astype(np.uint64)
    return high, low


def _distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)``, without its sort where every value is the same (a
    batch of one domain, delta and noise declaration: the usual case)."""
    if len(values) and (values == values[0]).all():
        return values[:1], np.zeros(len(values), np.intp)
    distinct, inverse = np.unique(values, return_inverse=True)
    return distinct, inverse.ravel()


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """``parts`` concatenated, each let go (popped) once copied: the parts and the whole are never held
    together."""
    whole = np.empty(sum(len(p) for p in parts), np.uint64)
    at = 0
    parts.reverse()
    while parts:
        part = parts.pop()
        whole[at:at + len(part)] = part
        at += len(part)
    return whole


class JobVerifier:
    """``verify_job`` one table of releases at a time (see the module docstring): per noise domain it
    keeps the worst spend, budget, composition and mechanism, and per release 16 bytes of ids to find
    a release written twice, so a job's output of any size is checked with one batch of it in memory."""

    def __init__(self, strict: bool = True) -> None:
        """``strict`` (the default): a release that declares no noise (its spend cannot be recomputed)
        is a problem; lenient (``strict=False``, for outputs of older versions) it is counted in the
        verdict's notes and its stated spend is used."""
        self.strict = strict
        self._domains, self._compositions, self._streams, self._mechanisms, self._purposes, self._noises = (
            _Names(), _Names(), _Names(), _Names(), _Names(), _Names())
        self._losses: list[tuple[float, float] | None] = []  # per distinct noise declaration (None: none)
        self._recomputed: dict[tuple[int, float], float] = {}  # (declaration id, stated delta) -> epsilon
        self._unrecomputable: dict[str, int] = {}
        self._spends: dict[int, _Domain] = {}
        self._high: list[np.ndarray] = []  # per batch: its keys' high words (one value where they agree)
        self._low: list[np.ndarray] = []
        self._declared: set[tuple[float, float]] = set()
        self.problems: list[str] = []
        self.rows = 0

    def add(self, table: "pa.Table | pa.RecordBatch") -> None:
        """Check one table of releases (the columns of :data:`VERIFIED_COLUMNS`; ``purpose`` may be absent
        in files written before it existed: every release then counts as its step's one release)."""
        for batch in (table.to_batches(65_536) if isinstance(table, pa.Table) else [table]):
            self._add_batch(batch)

    def _add_batch(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        domain, composition = self._domains(batch.column("noise_domain")), self._compositions(batch.column("composition"))
        mechanism = self._mechanisms(batch.column("mechanism"))
        names = batch.schema.names
        absent = pa.nulls(batch.num_rows, pa.string())
        purpose = self._purposes(batch.column("purpose") if "purpose" in names else absent)
        noise = self._noises(batch.column("noise") if "noise" in names else absent)
        number = {name: np.asarray(batch.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)
                  for name in _NUMBERS}
        step = np.asarray(pc.fill_null(batch.column("step"), -1).to_numpy(zero_copy_only=False), dtype=np.int64)

        def where(i: int) -> str:
            return f"release (stream {batch.column('stream')[i].as_py()!r}, step {batch.column('step')[i].as_py()})"

        def name(i: int) -> str:
            return self._domains.names[domain[i]]

        labelled = (np.array([n != "" for n in self._domains.names], dtype=bool)[domain]
                    & np.array([n in COMPOSITIONS for n in self._compositions.names], dtype=bool)[composition])
        self.problems += [f"{where(i)} has no noise domain or composition: not written by a domain-aware beam_dp"
                          for i in np.flatnonzero(~labelled)]
        high, low = _packed_keys(domain, purpose, self._streams(batch.column("stream")), step, labelled)
        self._high.append(high[:1] if len(high) and (high == high[0]).all() else high)
        self._low.append(low)
        eps, dlt, eps_budget, dlt_budget = (number[n] for n in ("epsilon_spent", "delta_spent", "epsilon_budget",
                                                                 "delta_budget"))
        pure = np.array([n == "pure" for n in self._compositions.names], dtype=bool)[composition]
        with np.errstate(invalid="ignore"):
            valid = labelled & np.isfinite(eps) & (eps >= 0) & (dlt >= 0) & (dlt < 1)
            over = valid & ((eps > eps_budget * (1 + _TOL)) | (dlt > dlt_budget * (1 + _TOL)))
            pure_delta = valid & pure & ((dlt > 0) | (dlt_budget > 0))
        self.problems += [f"{where(i)} of {name(i)!r} reports an invalid spend ({eps[i]}, {dlt[i]})"
                          for i in np.flatnonzero(labelled & ~valid)]
        self.problems += [f"{where(i)} of {name(i)!r} spends ({eps[i]:.6g}, {dlt[i]:.3g}), more than its own budget "
                          f"({eps_budget[i]:.6g}, {dlt_budget[i]:.3g})" for i in np.flatnonzero(over)]
        self.problems += [f"{where(i)} of {name(i)!r} is 'pure' but reports delta {dlt[i]:.3g} of a delta budget "
                          f"{dlt_budget[i]:.3g}: pure epsilon-DP has no delta" for i in np.flatnonzero(pure_delta)]
        self._recompute(noise, mechanism, valid, eps, dlt, domain, where)
        families = [mechanism_family(n) for n in self._mechanisms.names]
        for d in _distinct(domain[labelled])[0].tolist():
            rows_of = np.flatnonzero(labelled & (domain == d))
            first = rows_of[0]
            spend = self._spends.setdefault(d, _Domain(int(composition[first]), families[mechanism[first]],
                                                       float(eps_budget[first]), float(dlt_budget[first])))
            agree = (composition[rows_of] == spend.composition) & (eps_budget[rows_of] == spend.epsilon_budget) & (
                dlt_budget[rows_of] == spend.delta_budget)
            self.problems += [f"{where(i)} of {name(i)!r} disagrees with the domain's other releases about its budget "
                              "or composition" for i in rows_of[~agree]]
            other = rows_of[np.array([f != spend.family for f in families], dtype=bool)[mechanism[rows_of]]]
            self.problems += [f"{where(i)} of {name(i)!r} comes from mechanism "
                              f"{self._mechanisms.names[mechanism[i]]!r}, "
                              f"the domain's other releases from {spend.family!r}: two transforms share the noise "
                              "domain" for i in other[:1]]  # one line per batch: every such row says the same
            ok = rows_of[valid[rows_of]]
            spend.epsilon_spent = max(spend.epsilon_spent, float(eps[ok].max(initial=0.0)))
            spend.delta_spent = max(spend.delta_spent, float(dlt[ok].max(initial=0.0)))
            spend.pure_delta = spend.pure_delta or bool(pure_delta[rows_of].any())
            spend.releases += len(ok)
        budgets = np.stack([number["job_epsilon_budget"][valid], number["job_delta_budget"][valid]], axis=1)
        if len(budgets) and (budgets == budgets[0]).all():  # the usual case: one job budget
            budgets = budgets[:1]
        self._declared |= set(map(tuple, budgets.tolist()))

    def _recompute(self, noise: np.ndarray, mechanism: np.ndarray, valid: np.ndarray, eps: np.ndarray,
                   dlt: np.ndarray, domain: np.ndarray, where) -> None:
        """Recompute each valid release's epsilon from its noise declaration at its stated delta and
        flag those stating less (one line per domain and batch); count or flag those without one."""
        while len(self._losses) < len(self._noises.names):
            text = self._noises.names[len(self._losses)]
            try:
                self._losses.append(loss_of_declaration(text) if text else None)
            except ValueError as exc:
                self._losses.append(None)
                self.problems.append(f"a release declares its noise as {text[:80]!r}: {exc}")
        declared = np.array([loss is not None for loss in self._losses], dtype=bool)[noise]
        checked = valid & declared
        recomputed = np.full(len(eps), -np.inf)
        if checked.any():  # one recomputation per distinct (declaration, delta): few per job
            # each (declaration, delta) pair as one integer code: two flat sorts, not np.unique(axis=1) (20x slower)
            deltas, delta_of = _distinct(dlt[checked])
            pairs, inverse = _distinct(noise[checked].astype(np.int64) * len(deltas) + delta_of)
            recomputed[checked] = np.array([self._epsilon_of(int(p // len(deltas)), float(deltas[p % len(deltas)]))
                                            for p in pairs.tolist()], dtype=np.float64)[inverse.ravel()]
        with np.errstate(invalid="ignore"):
            below = checked & (eps < recomputed * (1 - _RECOMPUTE_TOL))
        for d in np.unique(domain[below]).tolist():
            rows = np.flatnonzero(below & (domain == d))
            i = rows[0]
            self.problems.append(f"{len(rows)} release(s) of {self._domains.names[d]!r} state an epsilon_spent below "
                                 f"the spend recomputed from its noise declaration, e.g. {where(i)}: {eps[i]:.6g} < "
                                 f"{recomputed[i]:.6g}")
        stripped = valid & ~declared & np.array([n in DECLARING_MECHANISMS for n in self._mechanisms.names],
                                                dtype=bool)[mechanism]
        for d in np.unique(domain[stripped]).tolist():
            rows = np.flatnonzero(stripped & (domain == d))
            self.problems.append(f"{len(rows)} release(s) of {self._domains.names[d]!r} lack the noise declaration "
                                 f"their mechanism writes, e.g. {where(rows[0])}")
        for d in np.unique(domain[valid & ~declared & ~stripped]).tolist():
            name = self._domains.names[d]
            self._unrecomputable[name] = self._unrecomputable.get(name, 0) + int(np.sum(valid & ~declared & ~stripped
                                                                                       & (domain == d)))

    def _epsilon_of(self, declaration: int, delta: float) -> float:
        """The epsilon recomputed from noise declaration ``declaration`` at ``delta`` (once per pair and job:
        the steps of a job repeat a few declarations)."""
        key = (declaration, delta)
        epsilon = self._recomputed.get(key)
        if epsilon is None:
            epsilon = self._recomputed[key] = recomputed_epsilon(self._losses[declaration], delta)
        return epsilon

    def _duplicates(self) -> list[str]:
        """A line for each (domain, purpose, stream, step) released more than once. A job of one domain and
        purpose (the usual) sorts its 8-byte low words in place; others sort (high, low) pairs."""
        counts = [len(part) for part in self._low]
        low = _joined(self._low)
        highs = np.unique(np.concatenate(self._high)) if self._high else np.zeros(0, np.uint64)
        if len(highs) <= 1:  # one (domain, purpose): each batch kept one high word
            self._low, self._high = [low], [highs]
            low.sort()  # in place: the keys' order means nothing
            high = np.broadcast_to(highs[:1], low.shape) if len(highs) else highs
            same = low[1:] == low[:-1]
        else:
            high = np.concatenate([np.broadcast_to(h, n) if len(h) == 1 else h for h, n in zip(self._high, counts)])
            self._low, self._high = [low], [high]
            order = np.lexsort((low, high))
            low, high = low[order], high[order]
            same = (low[1:] == low[:-1]) & (high[1:] == high[:-1])
        starts = np.flatnonzero(np.concatenate([[True], ~same]))
        runs = np.diff(np.append(starts, len(low)))
        purpose_mask = np.uint64((1 << _PURPOSE_BITS) - 1)

        def what(i: int) -> str:
            purpose = self._purposes.names[int(high[i] & purpose_mask)]
            return f", purpose {purpose!r}" if purpose else ""

        return [f"release (stream {self._streams.names[int(low[i] >> np.uint64(32))]!r}, step "
                f"{int(low[i] & np.uint64(_LOW32)) - 1}{what(i)}) of "
                f"{self._domains.names[int(high[i] >> np.uint64(_PURPOSE_BITS))]!r} "
                f"appears {n} times: two transforms share the noise domain"
                for i, n in zip(starts[runs > 1].tolist(), runs[runs > 1].tolist())]

    def verdict(self, epsilon: float | None = None, delta: float | None = None,
                manifest: JobManifest | None = None) -> JobVerdict:
        """The job's verdict over every table added. The declared total is ``epsilon``/``delta`` if
        given, else the ``manifest``'s (whose declarations the rows are then checked against, see
        :func:`manifest_problems`), else read from the releases' ``job_*_budget`` columns."""
        problems = self.problems + self._duplicates()
        unrecomputable = [f"{n} release(s) of {name!r} declare no noise: spend not recomputable"
                          for name, n in sorted(self._unrecomputable.items())]
        if self.strict:
            problems, notes = problems + [f"{line} (--lenient takes it as stated)" for line in unrecomputable], []
        else:
            notes = [f"{line}, taken as stated" for line in unrecomputable]
        spent = sorted((DomainSpend(self._domains.names[d], self._compositions.names[s.composition], s.epsilon_spent,
                                    s.delta_spent, s.epsilon_budget, s.delta_budget, s.releases, s.family)
                        for d, s in self._spends.items()), key=lambda d: d.domain)
        declared = sorted(self._declared)
        charged = [("approx" if self._spends[self._domains.ids[d.domain]].pure_delta else d.composition,
                    d.epsilon_spent, d.delta_spent) for d in spent]
        if manifest is not None:
            problems += manifest_problems(manifest, spent, declared)
            found = (manifest.epsilon, manifest.delta)
            # a declared transform without releases is charged its whole share
            seen = {d.domain for d in spent}
            charged += [(t.composition if t.composition in COMPOSITIONS and not (t.composition == "pure" and t.delta)
                         else "approx", t.epsilon, t.delta) for t in manifest.transforms if t.noise_domain not in seen]
        elif epsilon is None or delta is None:
            if len(declared) != 1:
                problems.append(f"the releases declare {len(declared)} different job totals {declared}; "
                                "pass --epsilon and --delta")
            found = declared[-1] if declared else (0.0, 0.0)
        epsilon = found[0] if epsilon is None else epsilon
        delta = found[1] if delta is None else delta
        worst = compose(charged, delta) if charged else 0.0
        if worst > epsilon * (1 + 1e-7):
            problems.append(f"the worst contribution spends epsilon {worst:.6g} at delta {delta:g} across the job's "
                            f"transforms, more than the declared total {epsilon:g}")
        if not spent and not problems:
            problems.append("no releases")
        return JobVerdict(float(epsilon), float(delta), float(worst), spent, problems, notes)


def manifest_problems(manifest: JobManifest, spent: list[DomainSpend], totals: list[tuple[float, float]]) -> list[str]:
    """Where the releases (their per-domain ``spent`` and the job ``totals`` they declare) and the job's
    manifest disagree, and what is wrong with the manifest itself (``JobManifest.problems``)."""
    problems = manifest.problems()
    declared = {t.noise_domain: t for t in manifest.transforms}
    seen = {d.domain: d for d in spent}
    problems += [f"transform {t.noise_domain!r} ({t.mechanism}, files {', '.join(t.files) or 'none'}) is declared in "
                 "the manifest but none of its releases was read" for t in manifest.transforms
                 if t.noise_domain not in seen]
    problems += [f"noise domain {d!r} has releases but is not declared in the manifest"
                 for d in seen if d not in declared]
    for name, d in seen.items():
        t = declared.get(name)
        if t is None:
            continue
        if d.composition != t.composition:
            problems.append(f"the releases of {name!r} compose as {d.composition!r}, the manifest says "
                            f"{t.composition!r}")
        if d.epsilon_budget > t.epsilon * (1 + _TOL) or d.delta_budget > t.delta * (1 + _TOL):
            problems.append(f"the releases of {name!r} state a budget ({d.epsilon_budget:.6g}, {d.delta_budget:.3g}) "
                            f"above the manifest's share ({t.epsilon:.6g}, {t.delta:.3g})")
        if d.mechanism != mechanism_family(t.mechanism):
            problems.append(f"the releases of {name!r} come from mechanism {d.mechanism!r}, the manifest says "
                            f"{t.mechanism!r}")
    total = (manifest.epsilon, manifest.delta)
    wrong = [x for x in totals if not (math.isclose(x[0], total[0], rel_tol=_TOL) and
                                       math.isclose(x[1], total[1], rel_tol=_TOL, abs_tol=1e-300))]
    if wrong:
        problems.append(f"the releases state job totals {wrong}, the manifest's total is {total}")
    return problems


def verify_job(rows: "Iterable[Mapping] | pa.Table | Iterable[pa.Table]", epsilon: float | None = None,
               delta: float | None = None, manifest: JobManifest | None = None, strict: bool = True) -> JobVerdict:
    """Recompute a job's worst per-contribution loss from its release rows, a table of them with the
    columns of ``beam_dp.io.RELEASE_SCHEMA``, or an iterable of such tables (e.g.
    ``beam_dp.io.iter_release_tables``; see the module docstring). Columnar: array operations one
    batch at a time, so a job's millions of releases verify in seconds and flat memory."""
    verifier = JobVerifier(strict)
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
    return verifier.verdict(epsilon, delta, manifest)


def _release_files(folder: str, manifest: JobManifest) -> tuple[list[str], list[str]]:
    """The file patterns of every transform the manifest declares, and a problem per pattern that
    matches no file (a transform's releases missing from the folder)."""
    from apache_beam.io.filesystems import FileSystems

    patterns, missing = [], []
    for t in manifest.transforms:
        for prefix in t.files:
            pattern = FileSystems.join(folder, f"{prefix}-*")
            if FileSystems.match([pattern])[0].metadata_list:
                patterns.append(pattern)
            else:
                missing.append(f"transform {t.noise_domain!r}'s release files {pattern} are missing")
        if not t.files:
            missing.append(f"transform {t.noise_domain!r} declares no release files")
    return patterns, missing


def _is_folder(path: str) -> bool:
    from apache_beam.io.filesystems import FileSystems

    from beam_dp.io.manifest import manifest_path

    return os.path.isdir(path) or FileSystems.exists(manifest_path(path))


def main(argv: list[str] | None = None) -> int:
    from beam_dp.cli import OneLineParser, guarded

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = OneLineParser(
        prog="python -m beam_dp.verify",
        description="Recompute a job's worst per-contribution privacy loss from its release files and check it "
                    "against the declared total and the job's manifest.")
    parser.add_argument("paths", nargs="+", help="a job's output folder (its manifest names the release files), or "
                        "release files (Parquet or JSON lines): globs or file prefixes")
    parser.add_argument("--manifest", default=None, help="the job's manifest (_beam_dp_manifest.json or its folder) "
                        "to check release files against")
    parser.add_argument("--lenient", dest="strict", action="store_false",
                        help="accept releases that declare no noise (outputs of beam_dp versions before every family "
                             "declared): their stated spend is used and listed as a note; by default they fail")
    parser.add_argument("--strict", dest="strict", action="store_true", default=True,
                        help="fail on releases that declare no noise (the default)")
    parser.add_argument("--epsilon", type=float, default=None, help="the job's declared total epsilon")
    parser.add_argument("--delta", type=float, default=None, help="the job's declared total delta")
    parser.add_argument("--verbose", action="store_true", help="show the traceback of an unexpected failure")
    args = parser.parse_args(argv)
    return guarded(parser.prog, args.verbose, lambda: _verify(args), (OSError, ValueError, pa.ArrowInvalid))


def _verify(args) -> int:
    from beam_dp.io.manifest import MANIFEST_NAME, read_manifest
    from beam_dp.io.readers import iter_release_tables

    verifier = JobVerifier(strict=args.strict)
    manifest, paths = None, list(args.paths)
    folder = args.manifest or (paths[0] if len(paths) == 1 and _is_folder(paths[0]) else None)
    try:
        if folder is not None:
            manifest = read_manifest(folder)
            folder = folder[: -len(MANIFEST_NAME)] if folder.endswith(MANIFEST_NAME) else folder
            patterns, missing = _release_files(folder, manifest)
            verifier.problems += missing
            if args.manifest is None:
                paths = patterns
        for path in paths:
            for table in iter_release_tables(path, VERIFIED_COLUMNS, dictionary_text=True):
                verifier.add(table)
    except FileNotFoundError as exc:
        if folder is None or manifest is not None:
            raise  # a usage error: one line, exit 2 (beam_dp.cli.guarded)
        print(f"{exc}: cannot tell which transforms the job ran\nNOT verified")
        return 1
    verdict = verifier.verdict(args.epsilon, args.delta, manifest)
    print(verdict.describe())
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
