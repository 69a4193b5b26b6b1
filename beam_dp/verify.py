"""Verify a whole job's privacy spend from its written release files.

``verify_job(rows, epsilon=None, delta=None)`` recomputes, from the releases alone, the worst
per-contribution loss across every transform (noise domain) of a job and compares it with the job's
declared total: for each domain it takes the largest ``epsilon_spent`` any release reports (a
transform's spend is the worst loss of any contribution so far, and never decreases), then composes
the domains with the rules of ``beam_dp.core.budget.compose`` at the job's ``delta``. It never takes a
stated spend on trust:

* each release's spend is recomputed from its noise declaration (``beam_dp.core.noise_declaration``),
  and a declaration that is empty, has a term of weight <= 0 or is missing where its mechanism writes
  one fails; its noise scales and account parameters must be the ones its mechanism's calibration,
  rebuilt from the row's budget and meta, gives at that step (sums, growing databases, incremental
  regression, ERM, L2DP-ML: ``beam_dp.verify_calibration``; an output written before its family
  declared a parameter that rebuild needs is checked by its declaration, with a note);
* a unit-level sum's release (``privacy_unit`` in its meta) must declare its bounding, and its unit's
  spend recomputed from it must not exceed its stated one (``beam_dp.verify_units``); a per-record
  family's unit-level release must declare ``max_records`` ``k``, and the spend of one unit of ``k``
  records (group privacy of its record-level spend) must not exceed its stated job spend or the job's
  budget; such a domain is charged that unit's spend in the job's composition (and, with the manifest,
  must fit the transform's share); with the manifest, every release of a transform it declares
  unit-level must declare that unit;
* a release of a mechanism beam_dp does not have (:data:`KNOWN_MECHANISMS`), or with a ``purpose`` its
  mechanism never writes (:data:`RELEASE_PURPOSES`), fails;
* it fails on a release that reports more than its own budget, a budget or job total that is not a
  finite epsilon > 0 and a delta in [0, 1), a domain whose releases disagree about their budget,
  composition or mechanism, a release without a noise domain, a ``"pure"`` domain that reports a
  delta > 0, and a (domain, stream, step, purpose) released twice with different content: a noise
  domain writes one release per stream, step and purpose, so two transforms sharing a domain are
  flagged whatever their ``mechanism`` or ``meta``. **Identical rows are one release**: an exact copy
  (an at-least-once sink's repeat) is counted once and noted.

Problem lines are capped at :data:`PROBLEM_LINES` per kind, then counted.

With the job's manifest (``beam_dp.io.manifest``, ``_beam_dp_manifest.json`` beside the releases) it
also fails when a declared transform has no release files or no releases, when a release's domain is
not declared, when the declared shares compose above the declared total, and when the rows' budget,
composition, mechanism or job total differ from the manifest; the manifest's total is then the job's
total, and a declared transform without releases is charged its whole share. Without one it cannot
check those (:data:`UNCHECKED_WITHOUT_MANIFEST`, printed), and warns when the rows' stated job spend
exceeds what the transforms present account for.

Command line::

    python -m beam_dp.verify output/demo                            # a job's folder: its manifest
    python -m beam_dp.verify 'output/demo/*.parquet' [--manifest output/demo] [--epsilon 1 --delta 0]

exits 0 when the job is within its total, 1 when it is not (the reasons are printed), 2 on bad usage
(including a ``--epsilon`` that is not finite and > 0, a ``--delta`` outside [0, 1)). A folder must
hold only its declared transforms' release files, its manifest and a summary (``summary.json``):
any other file fails, named (never its content). Files given by glob are checked against the
manifest of the folder they share, when it has one (a glob leaving out a declared file fails), and
each must be a release file. Every release must declare its noise (a release that declares none
fails); ``--lenient`` accepts such releases (outputs of versions before every family declared),
using their stated spend as a note. Without a manifest or ``--epsilon``/``--delta`` the declared
total is read from the releases' ``job_*_budget`` columns, which must agree.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import re
import sys
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_dp.core.budget import COMPOSITIONS, compose
from beam_dp.core.group_privacy import unit_spend
from beam_dp.core.noise_declaration import DeclaredLoss, loss_of_declaration, recomputed_epsilon
from beam_dp.io.manifest import JobManifest
from beam_dp.verify_calibration import RECOMPUTED_FAMILIES, Calibrations
from beam_dp.verify_units import UnitCalibrations, is_record_unit, record_unit_problem, record_unit_size

__all__ = ["KNOWN_MECHANISMS", "PROBLEM_LINES", "RELEASE_PURPOSES", "VERIFIED_COLUMNS", "DomainSpend", "JobVerdict",
           "JobVerifier", "main", "manifest_release_files", "verify_job"]

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
_ERM_MECHANISMS = ("erm", "erm_continual", "erm_sliding_window", "erm_multires", "multires_sampled")
#: every mechanism name a beam_dp release carries (those that declare their noise and those that do not)
KNOWN_MECHANISMS = DECLARING_MECHANISMS | frozenset({
    "continual_sum", "incremental_regression", "laplace_histogram", "smalldb", "mwem", "private_ftal", "wdp_cocop",
    "wdp_cocol", "agem_nonprivate", "lifelong", *_ERM_MECHANISMS})
#: mechanism -> the ``purpose`` its releases carry (a regular expression, matched whole); a mechanism not
#: listed writes one release a step, purpose ``""`` (beam_dp.core.release.Release)
RELEASE_PURPOSES: dict[str, str] = {
    "pmwg": r"query:\d+", "pmwg_synthetic": "synthetic",
    **{f"{m}{suffix}": purpose for m in ("bbscheduler", "bbimprover")
       for suffix, purpose in (("", r"query:.+"), ("_run", r"run:\d+"), ("_synthetic", "synthetic"))},
    **{m: r"model:.+" for m in _ERM_MECHANISMS},
}
#: distinct (spend, job spend) pairs kept per per-record unit-level domain for the job-spend check (its rows
#: declare one max_records, so a bound lowered on all of them shows on any)
_RECORD_SPENDS_KEPT = 64
#: problem lines shown per kind of problem; the rest are counted ("... and N more")
PROBLEM_LINES = 20


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
    warnings: list[str] = field(default_factory=list)  # signs of a problem the verifier cannot decide
    unchecked: list[str] = field(default_factory=list)  # checks it could not make (no manifest)

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
        lines += [f"  not checked without the job's manifest: {u}" for u in self.unchecked]
        lines += [f"  WARNING: {w}" for w in self.warnings]
        lines += [f"  PROBLEM: {p}" for p in self.problems]
        lines.append("verified: within the job's total" if self.ok else "NOT verified")
        return "\n".join(lines)


VERIFIED_COLUMNS = ("noise_domain", "composition", "stream", "step", "mechanism", "meta", "epsilon_spent",
                    "delta_spent", "epsilon_budget", "delta_budget", "job_epsilon_budget", "job_delta_budget",
                    "purpose", "noise", "value", "parts", "job_epsilon_spent", "job_delta_spent")
_NUMBERS = ("epsilon_spent", "delta_spent", "epsilon_budget", "delta_budget", "job_epsilon_budget", "job_delta_budget",
            "job_epsilon_spent", "job_delta_spent")
#: the columns a file must have to be read as releases (``purpose``, ``noise`` and the rest may be absent
#: in outputs of older versions)
_RELEASE_COLUMNS = ("stream", "step", "mechanism", "epsilon_spent", "delta_spent", "epsilon_budget", "delta_budget",
                    "noise_domain", "composition")
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
    text = {"noise_domain", "composition", "mechanism", "meta", "purpose", "noise", "parts"}
    columns = {name: [row.get(name) or ("" if name in text else 0.0) for row in rows] for name in VERIFIED_COLUMNS
               if name != "value"}
    columns["stream"] = [row.get("stream") for row in rows]
    columns["step"] = [row.get("step") for row in rows]
    columns["meta"] = [m if isinstance(m, str) else json.dumps(m, sort_keys=True) for m in columns["meta"]]
    columns["value"] = pa.array([[float(x) for x in np.ravel(_flat_value(row.get("value")))] for row in rows],
                                pa.list_(pa.float64()))
    return pa.table(columns)


def _flat_value(value) -> list:
    """A row's ``value`` as one list of floats (a mapping's arrays in name order, as the sinks write it)."""
    if value is None:
        return []
    if isinstance(value, Mapping):
        return [x for name in sorted(value) for x in np.ravel(value[name]).tolist()]
    return np.ravel(value).tolist()


_GOLDEN, _MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_MASK64 = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, elementwise on a uint64 array (wrapping arithmetic)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


def _list_hashes(column: "pa.ChunkedArray | pa.Array") -> np.ndarray:
    """A 64-bit hash of each row of a ``list<double>`` column: its length and each value's bits, in order."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    offsets = column.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    lengths = np.diff(offsets)
    bits = np.ascontiguousarray(column.values.to_numpy(zero_copy_only=False), dtype=np.float64).view(np.uint64)
    bits = bits[offsets[0]:offsets[-1]]
    row = np.repeat(np.arange(len(lengths)), lengths)
    position = (np.arange(offsets[0], offsets[-1]) - offsets[:-1][row]).astype(np.uint64)
    sums = np.concatenate([np.zeros(1, np.uint64), np.cumsum(_mix(bits + position * _GOLDEN), dtype=np.uint64)])
    start = offsets - offsets[0]
    return _mix((sums[start[1:]] - sums[start[:-1]]) ^ lengths.astype(np.uint64))


def _text_hashes(column: "pa.ChunkedArray | pa.Array") -> np.ndarray:
    """A 64-bit hash of each row of a text column (this process's string hash, once per distinct value)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    encoded = pc.dictionary_encode(pc.fill_null(column, ""))
    words = np.array([hash(text) & _MASK64 for text in encoded.dictionary.to_pylist()], dtype=np.uint64)
    return words[encoded.indices.to_numpy(zero_copy_only=False)]


def _row_hashes(words: Iterable[np.ndarray]) -> np.ndarray:
    """One 64-bit hash per row of the uint64 word columns ``words`` (equal rows, equal hashes)."""
    hashed: np.ndarray | None = None
    for word in words:
        hashed = _mix(word) if hashed is None else _mix((hashed * _MIX1) ^ word)
    if hashed is None:
        raise ValueError("no word columns to hash")
    return hashed


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
    keeps the worst spend, budget, composition and mechanism, and per release 24 bytes (16 of ids, 8 of
    a hash of its content) to find a release written twice, so a job's output of any size is checked
    with one batch of it in memory."""

    def __init__(self, strict: bool = True) -> None:
        """``strict`` (the default): a release that declares no noise (its spend cannot be recomputed)
        or comes from a mechanism beam_dp does not have is a problem; lenient (``strict=False``, for
        outputs of older versions) it is counted in the verdict's notes and its stated spend is used."""
        self.strict = strict
        self._domains, self._compositions, self._streams, self._mechanisms, self._purposes, self._noises = (
            _Names(), _Names(), _Names(), _Names(), _Names(), _Names())
        self._losses: list[DeclaredLoss | None] = []  # per distinct noise declaration (None: none)
        self._recomputed: dict[tuple[int, float], float] = {}  # (declaration id, stated delta) -> epsilon
        self._unrecomputable: dict[str, int] = {}
        self._unknown: dict[str, int] = {}  # mechanism names beam_dp does not write -> releases
        self._purpose_ok: dict[tuple[int, int], bool] = {}  # (mechanism id, purpose id) -> written by it
        self._spends: dict[int, _Domain] = {}
        self._high: list[np.ndarray] = []  # per batch: its keys' high words (one value where they agree)
        self._low: list[np.ndarray] = []
        self._content: list[np.ndarray] = []  # per batch: a hash of each keyed release's content
        self._declared: set[tuple[float, float]] = set()
        self._job_spent = 0.0  # the largest job_epsilon_spent a release states
        self._shown: dict[str, int] = {}
        self._hidden: dict[str, int] = {}
        self._calibrations = Calibrations()
        self._units = UnitCalibrations()  # unit-level releases: their spend from their declared bounding
        self._record_units: dict[int, set[int]] = {}  # domain id -> the max_records its per-record releases declare
        self._unit_metas: dict[tuple[int, int], tuple] = {}  # (meta hash, mechanism) -> (unit, max_records, problem)
        self._record_checked: dict[tuple, str | None] = {}  # (composition, spends, budget, k) -> problem
        #: domain id -> its distinct (composition, spend, delta, job spend, job delta, k, where) (record units)
        self._record_spends: dict[int, set[tuple]] = {}
        self._calibrated: dict[int, str | None] = {}  # hash of (mechanism, noise, meta, step, budget) -> problem
        self.problems: list[str] = []
        self.rows = 0

    def flag(self, kind: str, rows: Iterable, line: Callable[..., str]) -> None:
        """Add the problem ``line(i)`` for each of ``rows``: the first :data:`PROBLEM_LINES` of a ``kind``
        shown, the others counted (formatted only when shown)."""
        for i in rows:
            if self._shown.get(kind, 0) < PROBLEM_LINES:
                self._shown[kind] = self._shown.get(kind, 0) + 1
                self.problems.append(line(i))
            else:
                self._hidden[kind] = self._hidden.get(kind, 0) + 1

    def add(self, table: "pa.Table | pa.RecordBatch") -> None:
        """Check one table of releases (the columns of :data:`VERIFIED_COLUMNS`; ``purpose`` may be absent
        in files written before it existed: every release then counts as its step's one release)."""
        for batch in (table.to_batches(65_536) if isinstance(table, pa.Table) else [table]):
            self._add_batch(batch)

    def _add_batch(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        domain = self._domains(batch.column("noise_domain"))
        composition = self._compositions(batch.column("composition"))
        mechanism = self._mechanisms(batch.column("mechanism"))
        names = batch.schema.names
        absent = pa.nulls(batch.num_rows, pa.string())
        purpose = self._purposes(batch.column("purpose") if "purpose" in names else absent)
        noise = self._noises(batch.column("noise") if "noise" in names else absent)
        zeros = np.zeros(batch.num_rows)
        number = {name: np.asarray(batch.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)
                  if name in names else zeros for name in _NUMBERS}
        step = np.asarray(pc.fill_null(batch.column("step"), -1).to_numpy(zero_copy_only=False), dtype=np.int64)

        def where(i: int) -> str:
            return f"release (stream {batch.column('stream')[i].as_py()!r}, step {batch.column('step')[i].as_py()})"

        def name(i: int) -> str:
            return self._domains.names[domain[i]]

        labelled = (np.array([n != "" for n in self._domains.names], dtype=bool)[domain]
                    & np.array([n in COMPOSITIONS for n in self._compositions.names], dtype=bool)[composition])
        self.flag("unlabelled", np.flatnonzero(~labelled), lambda i: f"{where(i)} has no noise domain or composition: "
                  "not written by a domain-aware beam_dp")
        streams = self._streams(batch.column("stream"))
        high, low = _packed_keys(domain, purpose, streams, step, labelled)
        self._high.append(high[:1] if len(high) and (high == high[0]).all() else high)
        self._low.append(low)
        meta_hash = _text_hashes(batch.column("meta") if "meta" in names else absent)
        self._content.append(self._content_hashes(batch, names, mechanism, noise, composition, number,
                                                  meta_hash)[labelled])
        eps, dlt, eps_budget, dlt_budget = (number[n] for n in ("epsilon_spent", "delta_spent", "epsilon_budget",
                                                                 "delta_budget"))
        pure = np.array([n == "pure" for n in self._compositions.names], dtype=bool)[composition]
        with np.errstate(invalid="ignore"):
            valid = labelled & np.isfinite(eps) & (eps >= 0) & (dlt >= 0) & (dlt < 1)
            budgeted = (np.isfinite(eps_budget) & (eps_budget > 0) & np.isfinite(dlt_budget) & (dlt_budget >= 0)
                        & (dlt_budget < 1))
            over = valid & ((eps > eps_budget * (1 + _TOL)) | (dlt > dlt_budget * (1 + _TOL)))
            pure_delta = valid & pure & ((dlt > 0) | (dlt_budget > 0))
        self.flag("invalid spend", np.flatnonzero(labelled & ~valid),
                  lambda i: f"{where(i)} of {name(i)!r} reports an invalid spend ({eps[i]}, {dlt[i]})")
        self.flag("invalid budget", np.flatnonzero(labelled & ~budgeted),
                  lambda i: f"{where(i)} of {name(i)!r} states a budget ({eps_budget[i]}, {dlt_budget[i]}): not a "
                            "finite epsilon > 0 and a delta in [0, 1)")
        self.flag("over budget", np.flatnonzero(over),
                  lambda i: f"{where(i)} of {name(i)!r} spends ({eps[i]:.6g}, {dlt[i]:.3g}), more than its own budget "
                            f"({eps_budget[i]:.6g}, {dlt_budget[i]:.3g})")
        self.flag("pure delta", np.flatnonzero(pure_delta),
                  lambda i: f"{where(i)} of {name(i)!r} is 'pure' but reports delta {dlt[i]:.3g} of a delta budget "
                            f"{dlt_budget[i]:.3g}: pure epsilon-DP has no delta")
        self._check_names(mechanism, purpose, labelled, domain, where)
        self._recompute(noise, mechanism, valid, eps, dlt, domain, where)
        declared = np.array([loss is not None for loss in self._losses], dtype=bool)[noise]
        self._check_calibration(batch, valid & declared & budgeted, mechanism, noise, meta_hash, step, eps_budget,
                                dlt_budget, domain, where)
        self._check_record_units(batch, names, labelled, valid, mechanism, composition, domain, meta_hash, number,
                                 where)
        families = [mechanism_family(n) for n in self._mechanisms.names]
        for d in _distinct(domain[labelled])[0].tolist():
            rows_of = np.flatnonzero(labelled & (domain == d))
            first = rows_of[0]
            spend = self._spends.setdefault(d, _Domain(int(composition[first]), families[mechanism[first]],
                                                       float(eps_budget[first]), float(dlt_budget[first])))
            agree = (composition[rows_of] == spend.composition) & (eps_budget[rows_of] == spend.epsilon_budget) & (
                dlt_budget[rows_of] == spend.delta_budget)
            self.flag("disagree", rows_of[~agree], lambda i: f"{where(i)} of {name(i)!r} disagrees with the domain's "
                      "other releases about its budget or composition")
            other = rows_of[np.array([f != spend.family for f in families], dtype=bool)[mechanism[rows_of]]]
            self.flag("mixed mechanisms", other[:1],  # one line per batch: every such row says the same
                      lambda i, family=spend.family: f"{where(i)} of {name(i)!r} comes from mechanism "
                                f"{self._mechanisms.names[mechanism[i]]!r}, the domain's other releases from "
                                f"{family!r}: two transforms share the noise domain")
            ok = rows_of[valid[rows_of]]
            spend.epsilon_spent = max(spend.epsilon_spent, float(eps[ok].max(initial=0.0)))
            spend.delta_spent = max(spend.delta_spent, float(dlt[ok].max(initial=0.0)))
            spend.pure_delta = spend.pure_delta or bool(pure_delta[rows_of].any())
            spend.releases += len(ok)
        job_spent = number["job_epsilon_spent"][valid]
        job_spent = job_spent[np.isfinite(job_spent)]
        self._job_spent = max(self._job_spent, float(job_spent.max(initial=0.0)))
        budgets = np.stack([number["job_epsilon_budget"][valid], number["job_delta_budget"][valid]], axis=1)
        if len(budgets) and (budgets == budgets[0]).all():  # the usual case: one job budget
            budgets = budgets[:1]
        self._declared |= set(map(tuple, budgets.tolist()))

    def _content_hashes(self, batch: pa.RecordBatch, names: list[str], mechanism: np.ndarray, noise: np.ndarray,
                        composition: np.ndarray, number: dict[str, np.ndarray], meta_hash: np.ndarray) -> np.ndarray:
        """A 64-bit hash per release of what it says (value, parts, meta, mechanism, composition, noise
        declaration, spends and budgets): equal for exact copies of one release."""
        absent = pa.nulls(batch.num_rows, pa.string())
        words = [mechanism.astype(np.uint64), noise.astype(np.uint64), composition.astype(np.uint64)]
        words += [np.ascontiguousarray(number[n]).view(np.uint64) for n in _NUMBERS]
        words += [meta_hash, _text_hashes(batch.column("parts") if "parts" in names else absent)]
        if "value" in names:
            words.append(_list_hashes(batch.column("value")))
        return _row_hashes(words)

    def _check_calibration(self, batch: pa.RecordBatch, rows_mask: np.ndarray, mechanism: np.ndarray,
                           noise: np.ndarray, meta_hash: np.ndarray, step: np.ndarray, eps_budget: np.ndarray,
                           dlt_budget: np.ndarray, domain: np.ndarray, where) -> None:
        """Flag the releases of a recomputed family (a sum, an ERM model) whose noise declaration is not
        the one its mechanism's calibration gives from the release's public parameters at its step
        (:mod:`beam_dp.verify_calibration`): once per distinct (mechanism, declaration, meta, step,
        budget) in the job."""
        family = np.array([n in RECOMPUTED_FAMILIES for n in self._mechanisms.names], dtype=bool)[mechanism]
        rows = np.flatnonzero(rows_mask & family)
        if not len(rows):
            return
        stream = batch.column("stream")
        scoped = np.array([n in RECOMPUTED_FAMILIES and self._calibrations.scoped(n) for n in self._mechanisms.names],
                          dtype=bool)[mechanism[rows]]
        streams = np.zeros(len(rows), dtype=np.uint64)  # a family whose check ignores the stream: one per stream set
        if scoped.any():
            streams[scoped] = _text_hashes(stream.take(pa.array(rows[scoped])))
        keys = _row_hashes([mechanism[rows].astype(np.uint64), noise[rows].astype(np.uint64), meta_hash[rows],
                            step[rows].astype(np.uint64), np.ascontiguousarray(eps_budget[rows]).view(np.uint64),
                            np.ascontiguousarray(dlt_budget[rows]).view(np.uint64), domain[rows].astype(np.uint64),
                            streams])
        distinct, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        meta = batch.column("meta")
        reasons: list[str | None] = []
        for key, i in zip(distinct.tolist(), first.tolist()):
            r = int(rows[i])
            if key not in self._calibrated:
                args = (self._mechanisms.names[mechanism[r]], meta[r].as_py() or "", float(eps_budget[r]),
                        float(dlt_budget[r]))
                self._calibrated[key] = self._calibrations.problem(
                    *args, int(step[r]), self._noises.names[noise[r]],
                    scope=(self._domains.names[domain[r]], stream[r].as_py())) or self._units.problem(
                    *args, self._noises.names[noise[r]], domain=self._domains.names[domain[r]])
            reasons.append(self._calibrated[key])
        failed = np.array([why is not None for why in reasons], dtype=bool)[inverse.ravel()]
        for d in np.unique(domain[rows[failed]]).tolist():
            affected = np.flatnonzero(failed & (domain[rows] == d))
            why = reasons[int(inverse.ravel()[affected[0]])]
            self.flag("calibration", rows[affected[:1]], lambda i, n=len(affected), d=d, why=why: (
                f"{n} release(s) of {self._domains.names[d]!r} do not declare the noise their mechanism's "
                f"public calibration gives, e.g. {where(i)}: {why}"))

    def _check_record_units(self, batch: pa.RecordBatch, names: list[str], labelled: np.ndarray, valid: np.ndarray,
                            mechanism: np.ndarray, composition: np.ndarray, domain: np.ndarray, meta_hash: np.ndarray,
                            number: dict[str, np.ndarray], where) -> None:
        """Record each release's privacy unit (for the manifest's unit checks) and flag a per-record family's
        unit-level release whose ``max_records`` is missing or malformed, or whose stated job spend is below
        one unit's (:func:`beam_dp.verify_units.record_unit_problem`); only releases whose meta names a
        ``privacy_unit`` are parsed, once per distinct meta."""
        unit_rows = (_contains(batch.column("meta"), '"privacy_unit"') if "meta" in names
                     else np.zeros(batch.num_rows, dtype=bool))
        for d in _distinct(domain[labelled & ~unit_rows])[0].tolist():
            self._units.declare(self._domains.names[d], None)
        rows = np.flatnonzero(labelled & unit_rows)
        if not len(rows):
            return
        spends = ("epsilon_spent", "delta_spent", "job_epsilon_spent", "job_delta_spent", "job_epsilon_budget",
                  "job_delta_budget")
        keys = _row_hashes([meta_hash[rows], mechanism[rows].astype(np.uint64), domain[rows].astype(np.uint64),
                            composition[rows].astype(np.uint64), valid[rows].astype(np.uint64),
                            *(np.ascontiguousarray(number[n][rows]).view(np.uint64) for n in spends)])
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        meta = batch.column("meta")
        failed: dict[int, list] = {}  # domain id -> [rows failing, (first row, why)]
        for i, r in zip(range(len(first)), rows[first].tolist()):
            parsed_key = (int(meta_hash[r]), int(mechanism[r]))
            parsed = self._unit_metas.get(parsed_key)
            if parsed is None:
                parsed = self._unit_metas[parsed_key] = _record_unit_of(self._mechanisms.names[mechanism[r]],
                                                                         meta[r].as_py())
            unit, k, why = parsed
            d = int(domain[r])
            self._units.declare(self._domains.names[d], unit)
            if (k is None and why is None) or not valid[r]:
                continue
            if why is None:
                self._record_units.setdefault(d, set()).add(k)
                spend = (int(composition[r]), *(float(number[n][r]) for n in spends[:5]), k)
                if spend not in self._record_checked:
                    self._record_checked[spend] = record_unit_problem(self._compositions.names[spend[0]], *spend[1:])
                    sample = self._record_spends.setdefault(d, set())
                    if len(sample) < _RECORD_SPENDS_KEPT:
                        sample.add(spend[:4] + (float(number["job_delta_budget"][r]), k, where(r)))
                why = self._record_checked[spend]
            if why is not None:
                entry = failed.setdefault(d, [0, (r, why)])
                entry[0] += int(np.sum(inverse == i))
        for d, (n, item) in sorted(failed.items()):
            self.flag("record unit", [item], lambda item, n=n, d=d: (
                f"{n} unit-level release(s) of {self._domains.names[d]!r} do not account for their privacy unit, "
                f"e.g. {where(item[0])}: {item[1]}"))

    def _check_names(self, mechanism: np.ndarray, purpose: np.ndarray, labelled: np.ndarray, domain: np.ndarray,
                     where) -> None:
        """Flag a release whose ``purpose`` its mechanism never writes (:data:`RELEASE_PURPOSES`), and
        count those of a mechanism beam_dp does not have (:data:`KNOWN_MECHANISMS`)."""
        pairs = _distinct(mechanism[labelled].astype(np.int64) * (1 << 32) + purpose[labelled])[0]
        for pair in pairs.tolist():
            m, p = divmod(pair, 1 << 32)
            ok = self._purpose_ok.get((m, p))
            if ok is None:
                name, text = self._mechanisms.names[m], self._purposes.names[p]
                ok = self._purpose_ok[(m, p)] = re.fullmatch(RELEASE_PURPOSES.get(name, ""), text) is not None
            if not ok:
                rows = np.flatnonzero(labelled & (mechanism == m) & (purpose == p))
                self.flag("purpose", rows[:1], lambda i, n=len(rows), m=m, p=p: (
                    f"{n} release(s) of {self._domains.names[domain[i]]!r} from {self._mechanisms.names[m]!r} "
                    f"carry purpose {self._purposes.names[p]!r}, which that mechanism never writes, e.g. {where(i)}"))
        for m in _distinct(mechanism[labelled])[0].tolist():
            name = self._mechanisms.names[m]
            if name not in KNOWN_MECHANISMS:
                self._unknown[name] = self._unknown.get(name, 0) + int(np.sum(labelled & (mechanism == m)))

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
                self.flag("malformed declaration", [f"a release declares its noise as {text[:80]!r}: {exc}"], str)
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
            self.flag("below recomputed", rows[:1], lambda i, n=len(rows), d=d: (
                f"{n} release(s) of {self._domains.names[d]!r} state an epsilon_spent below the spend "
                f"recomputed from its noise declaration, e.g. {where(i)}: {eps[i]:.6g} < {recomputed[i]:.6g}"))
        stripped = valid & ~declared & np.array([n in DECLARING_MECHANISMS for n in self._mechanisms.names],
                                                dtype=bool)[mechanism]
        for d in np.unique(domain[stripped]).tolist():
            rows = np.flatnonzero(stripped & (domain == d))
            self.flag("stripped declaration", rows[:1], lambda i, n=len(rows), d=d: (
                f"{n} release(s) of {self._domains.names[d]!r} lack the noise declaration their mechanism "
                f"writes, e.g. {where(i)}"))
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
            loss = self._losses[declaration]
            if loss is None:
                raise ValueError(f"noise declaration {declaration} was not recomputable")
            epsilon = self._recomputed[key] = recomputed_epsilon(loss, delta)
        return epsilon

    def _duplicates(self) -> tuple[dict[int, int], list[tuple[int, int, int, int]]]:
        """Each (domain, purpose, stream, step) released more than once: per domain, how many releases
        are exact copies of another (the same content hash: one release written twice, e.g. by an
        at-least-once sink), and ``(high, low, times, different)`` for each key released as two or more
        different releases."""
        counts = [len(part) for part in self._low]
        low, content = _joined(self._low), _joined(self._content)
        highs = np.unique(np.concatenate(self._high)) if self._high else np.zeros(0, np.uint64)
        parts, self._low, self._high, self._content = self._high, [], [], []
        if len(highs) <= 1:  # one (domain, purpose): each batch kept one high word
            keys = np.sort(low)
            repeated = np.unique(keys[1:][keys[1:] == keys[:-1]])
            del keys
            rows = np.flatnonzero(np.isin(low, repeated)) if len(repeated) else np.zeros(0, np.intp)
            high = np.broadcast_to(highs[:1], rows.shape) if len(highs) else np.zeros(0, np.uint64)
        else:
            high = np.concatenate([np.broadcast_to(h, n) if len(h) == 1 else h for h, n in zip(parts, counts)])
            order = np.lexsort((low, high))
            same = (low[order][1:] == low[order][:-1]) & (high[order][1:] == high[order][:-1])
            rows = np.sort(order[np.concatenate([same, [False]]) | np.concatenate([[False], same])])
            del order, same
            high = high[rows]
        # only the releases whose key repeats (none in an honest job) are sorted with their content
        low, content = low[rows], content[rows]
        order = np.lexsort((content, low, high))
        low, high, content = low[order], np.asarray(high)[order], content[order]
        same = (low[1:] == low[:-1]) & (high[1:] == high[:-1])
        starts = np.flatnonzero(np.concatenate([[True], ~same]))
        runs = np.diff(np.append(starts, len(low)))
        new_content = np.concatenate([[True], ~(same & (content[1:] == content[:-1]))]).astype(np.int64)
        different = np.add.reduceat(new_content, starts) if len(starts) else np.zeros(0, np.int64)
        copies: dict[int, int] = {}
        repeated = runs > 1
        for i, n, k in zip(starts[repeated].tolist(), runs[repeated].tolist(), different[repeated].tolist()):
            d = int(high[i] >> np.uint64(_PURPOSE_BITS))
            copies[d] = copies.get(d, 0) + n - k
        clashes = [(int(high[i]), int(low[i]), n, k) for i, n, k in
                   zip(starts[repeated].tolist(), runs[repeated].tolist(), different[repeated].tolist()) if k > 1]
        return copies, clashes

    def _clash_line(self, clash: tuple[int, int, int, int]) -> str:
        high, low, times, different = clash
        purpose = self._purposes.names[high & ((1 << _PURPOSE_BITS) - 1)]
        copies = f" ({different} different releases)" if different < times else ""
        return (f"release (stream {self._streams.names[low >> 32]!r}, step {(low & _LOW32) - 1}"
                f"{f', purpose {purpose!r}' if purpose else ''}) of {self._domains.names[high >> _PURPOSE_BITS]!r} "
                f"appears {times} times{copies}: two transforms share the noise domain")

    def _charged(self, d: DomainSpend) -> tuple[str, float, float]:
        """What a domain adds to the job's composition: its worst spend, a per-record unit's as one unit's
        (group privacy over its declared ``max_records``)."""
        composition = "approx" if self._spends[self._domains.ids[d.domain]].pure_delta else d.composition
        sizes = self._record_units.get(self._domains.ids[d.domain])
        if not sizes or d.epsilon_spent <= 0:
            return composition, d.epsilon_spent, d.delta_spent
        try:
            return composition, *unit_spend(composition, d.epsilon_spent, d.delta_spent, max(sizes))
        except ValueError:  # flagged per release (record_unit_problem): charged as approx
            return "approx", *unit_spend("approx", d.epsilon_spent, d.delta_spent, max(sizes))

    def _record_job_spends(self, shares: list[tuple[str, str, float, float]]) -> list[str]:
        """A per-record unit-level release whose stated job spend is not its unit's spend (group privacy over
        its declared ``max_records``) composed with the job's other ``shares`` ``(domain, composition,
        epsilon, delta)`` at their full amounts: a ``max_records`` lowered below the one its job spend was
        computed for (or raised above it)."""
        problems = []
        for d, spends in sorted(self._record_spends.items()):
            name = self._domains.names[d]
            others = [(c if c in COMPOSITIONS else "approx", e, dl) for n, c, e, dl in shares if n != name]
            for comp, eps, dlt, stated, job_delta, k, where in sorted(spends):
                if eps <= 0:
                    continue
                try:
                    unit = unit_spend(self._compositions.names[comp], eps, dlt, k)
                    expected = compose([(self._compositions.names[comp], *unit)] + others, job_delta)
                except ValueError:
                    continue  # flagged per release (record_unit_problem)
                if abs(stated - expected) > 1e-7 * max(expected, 1e-12):
                    problems.append(f"{where} of {name!r} states a job spend of epsilon {stated:.6g}, but one unit of "
                                    f"its declared max_records={k} records spends epsilon {expected:.6g} in the job: "
                                    "it declares another bound than the one its spend was computed for")
                    break
        return problems

    def _record_unit_sizes(self) -> list[str]:
        """A domain whose per-record releases declare different ``max_records``."""
        return [f"releases of {self._domains.names[d]!r} declare max_records {sorted(sizes)}: one transform bounds "
                "its units once" for d, sizes in sorted(self._record_units.items()) if len(sizes) > 1]

    def _record_unit_shares(self, manifest: JobManifest, spent: list[DomainSpend]) -> list[str]:
        """A per-record unit-level domain whose budget, as one unit's, exceeds the share the manifest declares."""
        declared = {t.noise_domain: t for t in manifest.transforms}
        problems = []
        for d in spent:
            sizes, t = self._record_units.get(self._domains.ids[d.domain]), declared.get(d.domain)
            if not sizes or t is None:
                continue
            _, eps, delta = self._charged(DomainSpend(d.domain, d.composition, d.epsilon_budget, d.delta_budget))
            if eps > t.epsilon * (1 + _TOL) or delta > t.delta * (1 + _TOL):
                problems.append(f"the budget of {d.domain!r} ({d.epsilon_budget:.6g}, {d.delta_budget:.3g}) is, for "
                                f"one unit of max_records={max(sizes)} records, ({eps:.6g}, {delta:.3g}): above the "
                                f"share ({t.epsilon:.6g}, {t.delta:.3g}) the manifest declares")
        return problems

    def verdict(self, epsilon: float | None = None, delta: float | None = None,
                manifest: JobManifest | None = None) -> JobVerdict:
        """The job's verdict over every table added (call once). The declared total is
        ``epsilon``/``delta`` if given, else the ``manifest``'s (whose declarations the rows are then
        checked against, see :func:`manifest_problems`), else read from the releases' ``job_*_budget``
        columns. Identical releases (same key and content) count as one release."""
        copies, clashes = self._duplicates()
        self.flag("duplicate", range(len(clashes)), lambda i: self._clash_line(clashes[i]))
        unmatched = self._calibrations.unmatched()
        self.flag("calibration", range(len(unmatched)), lambda i: (
            f"releases do not declare the noise their mechanism's public calibration gives: {unmatched[i]}"))
        problems = self.problems + [f"... and {n} more problem(s) of this kind: {kind}"
                                    for kind, n in sorted(self._hidden.items())]
        unrecomputable = [f"{n} release(s) of {name!r} declare no noise: spend not recomputable"
                          for name, n in sorted(self._unrecomputable.items())]
        unknown = [f"{n} release(s) come from mechanism {name!r}, which beam_dp does not have"
                   for name, n in sorted(self._unknown.items())]
        if self.strict:
            problems = problems + [f"{line} (--lenient takes it as stated)" for line in unrecomputable + unknown]
            notes = []
        else:
            notes = [f"{line}, taken as stated" for line in unrecomputable + unknown]
        notes += self._calibrations.notes()
        notes += [f"{n} release(s) of {self._domains.names[d]!r} are exact copies of another (identical rows are "
                  "one release, e.g. an at-least-once sink's repeats): counted once"
                  for d, n in sorted(copies.items()) if n]
        spent = sorted((DomainSpend(self._domains.names[d], self._compositions.names[s.composition], s.epsilon_spent,
                                    s.delta_spent, s.epsilon_budget, s.delta_budget, s.releases - copies.get(d, 0),
                                    s.family)
                        for d, s in self._spends.items()), key=lambda d: d.domain)
        declared = sorted(self._declared)
        charged = [self._charged(d) for d in spent]
        warnings, unchecked = [], []
        problems += self._record_unit_sizes()
        if manifest is not None:
            problems += manifest_problems(manifest, spent, declared)
            problems += self._record_unit_shares(manifest, spent)
            problems += self._record_job_spends([(t.noise_domain, t.composition, t.epsilon, t.delta)
                                                 for t in manifest.transforms])
            problems += self._units.manifest_problems({t.noise_domain: t.privacy_unit for t in manifest.transforms
                                                       if t.privacy_unit is not None})
            found = (manifest.epsilon, manifest.delta)
            # a declared transform without releases is charged its whole share
            seen = {d.domain for d in spent}
            charged += [(t.composition if t.composition in COMPOSITIONS and not (t.composition == "pure" and t.delta)
                         else "approx", t.epsilon, t.delta) for t in manifest.transforms if t.noise_domain not in seen]
        else:
            problems += self._units.mixed()
            if len(spent) == 1:  # a lone transform: the job spend is its own
                problems += self._record_job_spends([(spent[0].domain, spent[0].composition, 0.0, 0.0)])
            unchecked = list(UNCHECKED_WITHOUT_MANIFEST)
            if epsilon is None or delta is None:
                if len(declared) != 1:
                    problems.append(f"the releases declare {len(declared)} different job totals {declared}; "
                                    "pass --epsilon and --delta")
                found = declared[-1] if declared else (0.0, 0.0)
        epsilon = found[0] if epsilon is None else epsilon
        delta = found[1] if delta is None else delta
        if not (math.isfinite(epsilon) and epsilon > 0 and math.isfinite(delta) and 0 <= delta < 1):
            problems.append(f"the job's total (epsilon {epsilon}, delta {delta}) is not a finite epsilon > 0 and a "
                            "delta in [0, 1)")
        worst = compose(charged, delta) if charged and 0 <= delta < 1 else 0.0
        if worst > epsilon * (1 + 1e-7):
            problems.append(f"the worst contribution spends epsilon {worst:.6g} at delta {delta:g} across the job's "
                            f"transforms, more than the declared total {epsilon:g}")
        if manifest is None and self._job_spent > worst * (1 + 1e-6) + 1e-12:
            warnings.append(f"the releases state a job spend of epsilon up to {self._job_spent:.6g}, more than the "
                            f"{worst:.6g} the {len(spent)} transform(s) present account for: a transform's releases "
                            "may be missing (the job's manifest would tell)")
        if not spent and not problems:
            problems.append("no releases")
        return JobVerdict(float(epsilon), float(delta), float(worst), spent, problems, notes, warnings, unchecked)


def _contains(column: "pa.ChunkedArray | pa.Array", text: str) -> np.ndarray:
    """Whether each cell of a text column (plain or dictionary-encoded) contains ``text`` (null: False);
    a dictionary's distinct values are searched once."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = [np.zeros(0, dtype=bool)]
    for chunk in chunks:
        if pa.types.is_dictionary(chunk.type):
            hit = np.asarray(pc.fill_null(pc.match_substring(chunk.dictionary, text), False)
                             .to_numpy(zero_copy_only=False), dtype=bool)
            index = np.asarray(pc.fill_null(chunk.indices, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
            valid = np.asarray(chunk.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            parts.append(hit[index] & valid if len(hit) else np.zeros(len(chunk), dtype=bool))
        else:
            parts.append(np.asarray(pc.fill_null(pc.match_substring(chunk, text), False)
                                    .to_numpy(zero_copy_only=False), dtype=bool))
    return np.concatenate(parts)


def _record_unit_of(mechanism: str, meta_text: str | None) -> tuple:
    """``(privacy unit or None, max_records or None, problem or None)`` of a release's meta: ``max_records``
    only for a per-record family's unit-level release (a sum's bounding is ``beam_dp.verify_units``')."""
    try:
        meta = json.loads(meta_text) if meta_text else {}
    except ValueError:
        return None, None, None  # an unreadable meta names no unit (the calibration checks refuse it)
    unit = meta.get("privacy_unit") if isinstance(meta, dict) else None
    if unit is None or not is_record_unit(mechanism, meta):
        return unit, None, None
    try:
        return unit, record_unit_size(meta), None
    except ValueError as exc:
        return unit, None, str(exc)


#: what the verifier checks only against a job's manifest (printed when it has none)
UNCHECKED_WITHOUT_MANIFEST = (
    "that every transform the job ran has releases here (a transform's files removed go unseen)",
    "that the noise domains, their budgets, compositions and mechanisms are the ones the job declared",
    "that the job's total is the declared one (it is read from the releases' job_*_budget columns)",
)


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


#: public files a job's folder may hold beside its releases and manifest (``beam_dp.report``'s summary)
SUMMARY_NAMES = ("summary.json",)


def _local(path: str) -> str:
    return path if "://" in path else os.path.abspath(path)


def _matching(pattern: str) -> list[str]:
    """The files matching ``pattern`` (a glob, else a file prefix); ``FileNotFoundError`` if none."""
    from apache_beam.io.filesystem import BeamIOError
    from apache_beam.io.filesystems import FileSystems

    for candidate in (pattern, pattern + "*"):
        try:
            found = sorted(m.path for m in FileSystems.match([candidate])[0].metadata_list)
        except BeamIOError:  # e.g. a bucket that does not exist
            found = []
        found = [path for path in found if not os.path.isdir(path)]
        if found:
            return found
    raise FileNotFoundError(f"no release files match {pattern!r}")


def manifest_release_files(folder: str, manifest: JobManifest) -> tuple[list[str], list[str]]:
    """The files of every transform the manifest declares (``<folder>/<prefix>-*``), and a problem per
    prefix that matches no file (a transform's releases missing from the folder)."""
    from apache_beam.io.filesystems import FileSystems

    files, missing = [], []
    for t in manifest.transforms:
        for prefix in t.files:
            pattern = FileSystems.join(folder, f"{prefix}-*")
            found = sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
            if found:
                files += found
            else:
                missing.append(f"transform {t.noise_domain!r}'s release files {pattern} are missing")
        if not t.files:
            missing.append(f"transform {t.noise_domain!r} declares no release files")
    return files, missing


def _folder_files(folder: str) -> list[str]:
    """Every file in ``folder`` and the folders in it (a sink's empty temporary folders hold none)."""
    from apache_beam.io.filesystems import FileSystems

    if os.path.isdir(folder):
        return sorted(os.path.join(top, name) for top, _, names in os.walk(folder) for name in names)
    return sorted(m.path for m in FileSystems.match([FileSystems.join(folder, "**")])[0].metadata_list)


def _not_a_release_file(path: str) -> str | None:
    """Why the file at ``path`` is not a release file (``.parquet``, else JSON lines, as
    ``beam_dp.io.iter_release_tables`` reads it, with the release columns), or ``None``. Reads the
    Parquet schema or the first JSON line only, and never quotes the content."""
    from apache_beam.io.filesystems import FileSystems

    try:
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq

            with FileSystems.open(path) as fh:
                columns = pq.ParquetFile(fh).schema_arrow.names
        else:
            with FileSystems.open(path) as fh:
                line = fh.readline()
                while line and not line.strip():
                    line = fh.readline()
            if not line:
                return None  # an empty shard: no releases
            try:
                first = json.loads(line)
            except ValueError:
                return f"file {path} is not a release file (neither Parquet nor JSON lines)"
            if not isinstance(first, dict):
                return f"file {path} is not a release file (its first line is not a release record)"
            columns = list(first)
    except (OSError, ValueError, pa.ArrowException) as exc:
        kind = "Parquet" if path.endswith(".parquet") else "JSON lines"
        return f"file {path} is not a release file (unreadable as {kind}: {type(exc).__name__})"
    lacking = [c for c in _RELEASE_COLUMNS if c not in columns]
    if lacking:
        return f"file {path} is not a release table (it has no column {', '.join(lacking)})"
    return None


def _is_folder(path: str) -> bool:
    from apache_beam.io.filesystems import FileSystems

    from beam_dp.io.manifest import manifest_path

    return os.path.isdir(path) or FileSystems.exists(manifest_path(path))


def _positive(name: str, lower_open: bool):
    def parse(text: str) -> float:
        import argparse

        value = float(text)
        if not (math.isfinite(value) and (value > 0 if lower_open else value >= 0) and (lower_open or value < 1)):
            raise argparse.ArgumentTypeError(f"{name} must be {'a finite number > 0' if lower_open else 'in [0, 1)'}, "
                                             f"got {text}")
        return value

    parse.__name__ = name
    return parse


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
                        "to check release files against (default: the one beside the files, when they share a folder)")
    parser.add_argument("--lenient", dest="strict", action="store_false",
                        help="accept releases that declare no noise (outputs of beam_dp versions before every family "
                             "declared): their stated spend is used and listed as a note; by default they fail")
    parser.add_argument("--strict", dest="strict", action="store_true", default=True,
                        help="fail on releases that declare no noise (the default)")
    parser.add_argument("--epsilon", type=_positive("epsilon", True), default=None,
                        help="the job's declared total epsilon (finite, > 0)")
    parser.add_argument("--delta", type=_positive("delta", False), default=None,
                        help="the job's declared total delta (in [0, 1))")
    parser.add_argument("--verbose", action="store_true", help="show the traceback of an unexpected failure")
    args = parser.parse_args(argv)
    return guarded(parser.prog, args.verbose, lambda: _verify(args), (OSError, ValueError, pa.ArrowInvalid))


def _verify(args) -> int:
    from apache_beam.io.filesystems import FileSystems

    from beam_dp.io.manifest import MANIFEST_NAME, manifest_path, read_manifest
    from beam_dp.io.readers import iter_release_tables

    verifier = JobVerifier(strict=args.strict)
    paths = list(args.paths)
    by_folder = args.manifest is None and len(paths) == 1 and _is_folder(paths[0])
    folder = paths[0] if by_folder else args.manifest
    files = [] if by_folder else [path for pattern in paths for path in _matching(pattern)]
    beside = None
    if folder is None:  # release files: the manifest of the folder they share, if it has one
        parents = {posixpath.dirname(path) if "://" in path else os.path.dirname(_local(path)) for path in files}
        if len(parents) == 1 and FileSystems.exists(manifest_path(next(iter(parents)))):
            folder = beside = next(iter(parents))
    manifest = None
    if folder is not None:
        folder = folder[: -len(MANIFEST_NAME)] if folder.endswith(MANIFEST_NAME) else folder
        try:
            manifest = read_manifest(folder)
        except FileNotFoundError as exc:
            if not by_folder:
                raise  # a usage error: one line, exit 2 (beam_dp.cli.guarded)
            print(f"{exc}: cannot tell which transforms the job ran\nNOT verified")
            return 1
        declared, missing = manifest_release_files(folder, manifest)
        verifier.problems += missing
        public = {_local(manifest_path(folder))} | {_local(FileSystems.join(folder, n)) for n in SUMMARY_NAMES}
        known = {_local(path) for path in declared}
        if by_folder:
            files = declared
            verifier.flag("foreign file", [p for p in _folder_files(folder) if _local(p) not in known | public],
                          lambda p: f"file {p} in the job's folder is none of its declared transforms' release files, "
                                    "its manifest or a summary: a job's folder holds only those (raw data and dead "
                                    "letters belong elsewhere)")
        else:
            given = {_local(path) for path in files}
            verifier.flag("omitted file", sorted(known - given), lambda p: f"the manifest's release file {p} is not "
                          "among the files given: verify the job's folder, or give every file it declares")
            verifier.flag("undeclared file", [p for p in files if _local(p) not in known | public],
                          lambda p: f"file {p} is not a release file of a transform the manifest declares")
    for path in files:
        if os.path.basename(path) in (MANIFEST_NAME, *SUMMARY_NAMES):
            continue  # a glob such as 'out/*' matches them
        why = _not_a_release_file(path)
        if why is not None:
            verifier.flag("not a release file", [why], str)
            continue
        for table in iter_release_tables(path, VERIFIED_COLUMNS, dictionary_text=True):
            verifier.add(table)
    verdict = verifier.verdict(args.epsilon, args.delta, manifest)
    if beside is not None:
        verdict.notes.append(f"checked against the manifest beside the files, {manifest_path(beside)}")
    print(verdict.describe())
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
