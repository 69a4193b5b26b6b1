"""Beam transforms for private learners: ``OnlineLearner`` and ``IncrementalRegression`` (guide: ``docs/online.md``).

Both reuse the generic release stage (:func:`~beam_dp.beam.shell.batch_release.release_stage`: keyed by
stream; encoded mechanism state; count steps or event-time steps closed by watermark timers) behind their own
parse stage, which validates records and dead-letters bad ones. There is no privacy arithmetic
here: clipping, noise and accounting happen in the mechanisms (``beam_dp.mechanisms.online.learners`` and
``beam_dp.mechanisms.online.regression``). Model snapshots leave as mapping-valued releases
(``{"x": x̂}`` / ``{"theta": θ}``) converted to the one ``ReleaseRow`` schema of ``beam_dp.io``
(write them with ``WriteReleasesToParquet``/``WriteReleasesToJsonLines``).

Records:

* ``OnlineLearner``: ``(stream_id, features, label)`` or a mapping / ``beam.Row`` with fields
  ``stream_id``, ``features``, ``label``, or a :class:`~beam_dp.steps.columns.LabelledColumns` block
  of them (count steps: validated in vectorised passes, with the same dead letters per row). One record
  per step in arrival order within a stream (count steps): **the arrival order and count are public**, as
  are release times.
* ``IncrementalRegression``: the same, plus ``timestamp`` (``(stream_id, timestamp, features,
  label)``) when steps come from a ``StepClock``; with ``block_size = b`` a step is ``b`` records.

Bad input goes to ``dead_letter`` with a machine-readable reason and never reaches state:
``malformed``, ``bad_stream_id``, ``undeclared_stream``, ``bad_timestamp``, ``before_start``,
``after_end``, ``wrong_shape`` (feature dimension), ``non_finite`` (feature or label),
``bad_value`` (non-numeric; logistic labels other than ±1), ``late``. Labels with ``|y|`` above
the declared bound (1) and features with ``‖x‖ > 1`` are **clipped and counted** (metrics
``clipped_labels`` / ``clipped_features``), not dead-lettered: the guarantee assumes the clipped
values, so they are safe to use.

With ``privacy_unit=`` (a :class:`~beam_dp.core.group_privacy.RecordUnit`) every release protects one
privacy unit's whole contribution of at most ``max_records`` records, replaced by any other values in the
same positions (the unit's arrival pattern stays public, as arrival counts are), by group privacy over
the chain of its record substitutions, calibrated at the record-level budget
:func:`~beam_dp.core.group_privacy.record_budget` gives (``docs/online.md``, "Privacy units"). Records then
carry the unit field (a mapping key, a row attribute, or a tuple's last item); a bad id is a
``bad_unit_id`` dead letter without the id. On a batch replay and a streaming job alike: the unit stage
keeps each unit's first ``max_records`` records by arrival (one count per unit in keyed state, no
timers), so it delays no release.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Literal, Mapping, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from beam_dp.beam.shell.batch_release import release_stage
from beam_dp.beam.shell.blocks import (
    BundleBlocks,
    ColumnarParse,
    RecordColumns,
    alone,
    by_record,
    stack_rows,
)
from beam_dp.beam.shell.domains import bind_noise_domain, release_labels
from beam_dp.beam.shell.outputs import ContinualOutputs
from beam_dp.beam.shell.parse import DEAD_LETTER
from beam_dp.beam.shell.unit_records import BoundUnitRecords, with_record_unit
from beam_dp.core.budget import BudgetShare, check_params_budget
from beam_dp.core.clock import StepClock
from beam_dp.core.group_privacy import RecordUnit, check_unit_share
from beam_dp.core.limits import (
    EPSILON_RANGE,
    MAX_DIM,
    MAX_SCALE,
    check_clock,
    check_count,
    check_delta,
    check_number,
    check_window,
)
from beam_dp.steps.columns import LabelledColumns
from beam_dp.steps.events import DeadLetter, Reason, numeric_array, split_event
from beam_dp.steps.params import NoiseKey, check_schedule, check_streams
from beam_dp.steps.policies import RecordRows
from beam_dp.steps.schema import ReleaseRow

__all__ = ["IncrementalRegression", "IncrementalRegressionParams", "OnlineLearner", "OnlineLearnerParams"]


@dataclass(frozen=True)
class OnlineLearnerParams:
    """WDP-COCOP (``algorithm="cocop"``) or WDP-COCOL (``"cocol"``) per stream (``docs/online.md``).

    Guarantee: window ε-DP (``noise="gamma"``) or window (ε, δ)-DP (``"gaussian"``) over the last
    ``B = 2^⌈log₂ window⌉`` records of a stream, event level; older records are effectively
    published (see ``beam_dp.mechanisms.online.learners``). Steps: one record each, in arrival order.

    Args:
        dim: the feature dimension ``d`` (integer in ``[1, 10^7]``); features are clipped to L2 norm 1.
        constraint: the convex decision set: a spec (``"simplex"``, ``{"kind": "l1_ball", "radius": 1}``, ...)
            or a ``ConvexSet``; its diameter enters the sensitivity.
        epsilon: ``ε`` (in ``[1e-9, 1e9]``) of each record while inside the window.
        window: records protected (>= 1, rounded up to a power of two ``B``); beyond it a record's protection
            expires.
        algorithm: ``"cocop"`` (default) or ``"cocol"``.
        loss: ``"logistic"`` (default; labels ±1), ``"squared"`` (labels clipped to ``|y| <= 1``) or an
            ``OnlineLoss``.
        mu: the strong convexity ``μ > 0`` of a named loss (default 1.0; an ``OnlineLoss`` carries its own):
            the noise is calibrated for the sensitivity ``max(2L, L + μD)``.
        delta: ``δ`` (default 0.0): 0 with ``noise="gamma"`` (pure ε), in ``(0, 1)`` with ``"gaussian"``.
        noise: the window tree's noise: ``"gamma"`` (default, ε-DP) or ``"gaussian"`` ((ε, δ)-DP).
        calibration: Gaussian noise only: ``"analytic"`` (default, the window tree's exact sigma) or
            ``"paper"`` (eq. 16).
        beta: COCOL's failure probability in ``(0, 1)`` (default 0.05): its regret bound, not the privacy.
        alpha: COCOL's step constant in ``(0, 1]`` (default None: the paper's); accuracy only.
        C0: COCOL's offset constant ``>= 0`` (default None: the paper's); accuracy only.
        x1: the starting point, a point of the constraint set (default None: the set's own start point).
        streams, noise_key, budget: the step fields of :class:`~beam_dp.steps.params.StepParams` (steps are
            count steps of one record: no clock, lateness or restore).
        privacy_unit: the :class:`~beam_dp.core.group_privacy.RecordUnit` every release protects (default None:
            one record); set by the transform's ``privacy_unit=`` (``with_record_unit``), with ``epsilon``,
            ``delta`` the record-level budget and ``budget`` the unit's share.
    """

    dim: int
    constraint: Any
    epsilon: float
    window: int
    algorithm: Literal["cocop", "cocol"] = "cocop"
    loss: Any = "logistic"
    mu: float = 1.0
    delta: float = 0.0
    noise: Literal["gamma", "gaussian"] = "gamma"
    calibration: Literal["paper", "analytic"] = "analytic"  # the window tree's exact sigma; "paper": eq. 16
    beta: float = 0.05
    alpha: float | None = None
    C0: float | None = None
    x1: tuple[float, ...] | None = None
    streams: tuple[str, ...] | None = None
    noise_key: NoiseKey = field(default_factory=NoiseKey)
    budget: BudgetShare | None = None  # this transform's share of its job's budget (**share.params())
    privacy_unit: RecordUnit | None = None  # the unit protected (with_record_unit); None: one record

    allowed_lateness = 0.0  # the driver contract: count steps, nothing to restore
    restore_states = None

    def __post_init__(self) -> None:
        check_streams(self)
        check_count("dim", self.dim, 1, MAX_DIM)
        check_number("epsilon", self.epsilon, *EPSILON_RANGE)
        check_delta(self.delta)
        check_window(self.window, self.dim)
        check_number("mu", self.mu, 0.0, MAX_SCALE)
        check_number("beta", self.beta, 0.0, 1.0, low_open=True)
        check_unit_share(self.privacy_unit, self.budget)
        check_params_budget(self, self.build_mechanism())

    # the DoFn contract: count steps of one record
    @property
    def clock(self) -> None:
        return None

    @property
    def block_size(self) -> int:
        return 1

    @property
    def event_time(self) -> bool:
        return False

    def build_mechanism(self):
        from beam_dp.mechanisms.online.learners import make_online_learner

        kwargs: dict[str, Any] = dict(
            dim=self.dim, constraint=self.constraint, loss=self.loss, epsilon=self.epsilon, delta=self.delta,
            noise=self.noise, window=self.window, calibration=self.calibration, x1=self.x1,
        )
        if isinstance(self.loss, str):
            kwargs["mu"] = self.mu
        if self.algorithm == "cocol":
            kwargs.update(beta=self.beta, alpha=self.alpha, C0=self.C0)
        elif self.alpha is not None or self.C0 is not None:
            raise ValueError("alpha and C0 are WDP-COCOL constants")
        return make_online_learner(self.algorithm, **kwargs)


@dataclass(frozen=True)
class IncrementalRegressionParams:
    """PRIVINCREG₁ (``"privincreg1"``), PRIVINCREG₂ (``"privincreg2"``) or PRIVINCERM
    (``"privincerm"``) per stream; (ε, δ)-DP, event level (one record), forever (PRIVINCREG with
    ``horizon=None``) or over ``horizon`` steps (``docs/online.md``).

    Args:
        dim: the feature dimension ``d`` (integer in ``[1, 10^7]``); features are clipped to L2 norm 1 and
            labels to ``|y| <= 1``.
        epsilon: ``ε`` (in ``[1e-9, 1e9]``) of each record over the whole stream (or horizon).
        delta: ``δ`` in ``(0, 1)`` of each record.
        algorithm: ``"privincreg1"`` (default), ``"privincreg2"`` or ``"privincerm"``.
        constraint: the convex parameter set (a spec or a ``ConvexSet``; default ``"l2_ball"``).
        horizon: the public number of steps (>= 1; the clock's steps must fit); default None: forever
            (PRIVINCREG).
        release_every: release θ every ``k`` steps (>= 1; default 1).
        calibration: the trees' Gaussian sigma: ``"analytic"`` (default, exact) or ``"paper"``.
        options: the mechanism's other keyword arguments (``beta``, ``r_max``, ``m``, ``input_domain``,
            ``tau``, ``schedule``, ...; default none).
        clock, block_size, streams, noise_key, budget, allowed_lateness: the step fields of
            :class:`~beam_dp.steps.params.StepParams` (steps: event time or blocks of ``block_size`` records).
        privacy_unit: the :class:`~beam_dp.core.group_privacy.RecordUnit` every release protects (default None:
            one record); set by the transform's ``privacy_unit=`` (``with_record_unit``), with ``epsilon``,
            ``delta`` the record-level budget and ``budget`` the unit's share.
    """

    dim: int
    epsilon: float
    delta: float
    algorithm: Literal["privincreg1", "privincreg2", "privincerm"] = "privincreg1"
    constraint: Any = "l2_ball"
    horizon: int | None = None
    release_every: int = 1
    calibration: Literal["paper", "analytic"] = "analytic"  # the trees' exact sigma, as the jobs' --calibration
    options: Mapping[str, Any] = field(default_factory=dict)
    clock: StepClock | None = None
    block_size: int | None = None
    streams: tuple[str, ...] | None = None
    noise_key: NoiseKey = field(default_factory=NoiseKey)
    budget: BudgetShare | None = None  # this transform's share of its job's budget (**share.params())
    allowed_lateness: float = 0.0  # grace in seconds (event time), see beam_dp.steps.params
    privacy_unit: RecordUnit | None = None  # the unit protected (with_record_unit); None: one record

    restore_states = None  # the driver contract: nothing to restore

    def __post_init__(self) -> None:
        check_schedule(self.clock, self.block_size, self.allowed_lateness)
        check_streams(self)
        check_clock(self.clock, self.streams)
        check_count("dim", self.dim, 1, MAX_DIM)
        check_number("epsilon", self.epsilon, *EPSILON_RANGE)
        check_delta(self.delta)
        check_count("release_every", self.release_every)
        for name in ("horizon", "block_size"):
            if getattr(self, name) is not None:
                check_count(name, getattr(self, name))
        if self.horizon is not None and self.clock is not None and self.clock.last_step is not None:
            if self.clock.last_step > self.horizon:
                raise ValueError(f"the clock has {self.clock.last_step} steps but horizon is {self.horizon}")
        check_unit_share(self.privacy_unit, self.budget)
        check_params_budget(self, self.build_mechanism())

    @property
    def event_time(self) -> bool:
        return self.clock is not None

    def build_mechanism(self):
        from beam_dp.mechanisms.online.regression import make_incremental_regression

        kwargs: dict[str, Any] = dict(dim=self.dim, epsilon=self.epsilon, delta=self.delta,
                                      constraint=self.constraint, release_every=self.release_every, **self.options)
        if self.algorithm == "privincerm":
            kwargs["horizon"] = self.horizon
        else:
            kwargs.update(horizon=self.horizon, calibration=self.calibration)
        return make_incremental_regression(self.algorithm, **kwargs)


class ParseRecords(ColumnarParse, beam.DoFn):
    """Validate ``(stream, [timestamp,] features, label)`` records; emit
    ``(stream, (step, record, original))`` for ``ContinualReleaseDoFn`` or a dead letter. With count steps
    (no clock) a bundle's valid records of one stream leave as one block ``(stream, (None, RecordRows,
    elements))`` in arrival order (:class:`~beam_dp.beam.shell.blocks.BundleBlocks`), and a ``LabelledColumns``
    block is validated at once (the mechanism's ``records``, :func:`~beam_dp.beam.shell.blocks.column_rows`).
    Records read one by one from a file come as :class:`~beam_dp.beam.shell.blocks.RecordColumns`: each is
    checked as one element, and its letters, here or in the release stage (``late``), name its ``file#record=n``."""

    MAX_ROWS = 4096  # records per block
    rows_type = RecordRows  # a columnar block's valid records of one stream
    BISECT_ROWS = 16  # a refused run of columnar rows at most this long is checked row by row

    def __init__(self, params: Any):
        self._params = params

    def start_bundle(self) -> None:
        self._blocks = BundleBlocks(_record_rows, self.MAX_ROWS)

    def finish_bundle(self) -> Iterator:
        yield from self._blocks.flush()

    def setup(self) -> None:
        self._mechanism = self._params.build_mechanism()
        self._clock = self._params.clock
        self._streams = frozenset(self._params.streams) if self._params.streams is not None else None
        namespace = f"beam_dp/{self._mechanism.name}"
        self._elements = Metrics.counter(namespace, "elements")
        self._dead = Metrics.counter(namespace, "dead_letters")
        self._clipped_labels = Metrics.counter(namespace, "clipped_labels")
        self._clipped_features = Metrics.counter(namespace, "clipped_features")

    def _dead_letter(self, reason: str, detail: str, stream: str | None, element: Any, source: str | None = None):
        self._dead.inc()
        return beam.pvalue.TaggedOutput(DEAD_LETTER, DeadLetter(reason, detail, stream, element, source))

    def process(self, element: Any, timestamp=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam) -> Iterator:
        if isinstance(element, LabelledColumns) and self._clock is None:
            yield from self._process_columns(element, timestamp, window)
            return
        if isinstance(element, RecordColumns):
            yield from by_record(element, lambda row, original: self._one(row, timestamp, window, original))
            return
        yield from self._one(element, timestamp, window, element)

    def _one(self, element: Any, timestamp: Any, window: Any, original: Any) -> Iterator:
        """One record; ``original``: what stands for it downstream (a one-row block knowing its source)."""
        head = split_event(element, ("features", "label"), self._clock, self._streams)
        if isinstance(head, DeadLetter):
            yield self._dead_letter(*head)
            return
        stream, _, step, (features, label) = head
        record = self._record(stream, features, label, element)
        if isinstance(record, DeadLetter):
            yield self._dead_letter(*record)
            return
        self._count_clipping(np.asarray(features, dtype=np.float64)[None, :], np.array([float(label)]))
        self._elements.inc()
        if step is not None:
            yield stream, (step, record, alone(original))
        else:
            yield from self._blocks.add(stream, record, original, timestamp, window)

    def _record(self, stream: str, features: Any, label: Any, element: Any) -> Any:
        """The mechanism's record of one element, or its dead letter."""
        try:
            return self._mechanism.record(numeric_array(features, "features"), label)
        except (ValueError, TypeError) as exc:
            reason, _, detail = str(exc).partition(": ")
            if reason not in (Reason.WRONG_SHAPE, Reason.NON_FINITE, Reason.BAD_VALUE, Reason.BAD_DTYPE):
                reason, detail = Reason.BAD_VALUE, "features or label are not numeric"
            return DeadLetter(reason, detail, stream, element)

    def _check(self, element: Any) -> tuple[str, tuple] | DeadLetter:
        """One count-step element -> ``(stream, (features, label))`` as the mechanism normalised them, or its letter."""
        head = split_event(element, ("features", "label"), None, self._streams)
        if isinstance(head, DeadLetter):
            return head
        stream, _, _, (features, label) = head
        record = self._record(stream, features, label, element)
        return record if isinstance(record, DeadLetter) else (stream, _pair(record))

    def _chunk_seen(self, block: LabelledColumns, rows: np.ndarray, labels: np.ndarray) -> None:
        self._count_clipping(block.features[rows], labels if block.label_names is not None else block.labels[rows])

    def _vector(self, block: LabelledColumns, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows of ``block`` the mechanism's ``records`` accepts, bisected around refused rows (left
        to the per-record check); numbers only (class-like labels are checked one by one)."""
        ok = np.zeros(len(rows), dtype=bool)
        parts: list[tuple[np.ndarray, np.ndarray]] = []
        if block.label_names is None and block.features.shape[1:] == (self._mechanism.dim,):
            self._bisect(block.features[rows], block.labels[rows], 0, len(rows), ok, parts)
        x = np.concatenate([a for a, _ in parts]) if parts else np.zeros((0, self._mechanism.dim))
        return ok, x, np.concatenate([b for _, b in parts]) if parts else np.zeros(0)

    def _bisect(self, x: np.ndarray, y: np.ndarray, lo: int, hi: int, ok: np.ndarray, parts: list) -> None:
        if hi == lo:
            return
        try:
            parts.append(self._mechanism.records(x[lo:hi], y[lo:hi], hi - lo))
            ok[lo:hi] = True
        except (ValueError, TypeError):
            if hi - lo > self.BISECT_ROWS:
                mid = (lo + hi) // 2
                self._bisect(x, y, lo, mid, ok, parts)
                self._bisect(x, y, mid, hi, ok, parts)

    def _count_clipping(self, features: np.ndarray, labels: np.ndarray) -> None:
        # operator metrics only (never in releases): how often the declared bounds bind
        if clipped := int((np.linalg.norm(features, axis=1) > 1.0).sum()):
            self._clipped_features.inc(clipped)
        if clipped := int((np.abs(labels) > 1.0).sum()):
            self._clipped_labels.inc(clipped)


def _pair(record: Any) -> tuple[np.ndarray, float]:
    """A validated record (an ``OnlineRecord`` or an ``(x, y)`` pair) as ``(features float64, label float)``."""
    x, y = (record.a, record.b) if hasattr(record, "a") else record
    return np.asarray(x, dtype=np.float64), float(y)


def _record_rows(stream: str, records: list, originals: tuple) -> list:
    """Validated records (``OnlineRecord`` s or ``(x, y)`` pairs, or ``RecordRows`` chunks) of one stream
    as one block, in arrival order."""
    return [(stream, (None, stack_rows(records, RecordRows, _pair), originals))]


class _LearnerTransform(beam.PTransform):
    """(Bound units →) parse → (declared streams) → the release stage (`release_stage`), as the continual-sum
    transforms."""

    params_type: type = object

    def __init__(self, params: Any, label: str | None = None, privacy_unit: RecordUnit | None = None):
        super().__init__(label)
        if not isinstance(params, self.params_type):
            raise TypeError(f"{type(self).__name__} takes a {self.params_type.__name__}")
        self.params: Any = params if privacy_unit is None else with_record_unit(params, privacy_unit)

    def expand(self, records) -> ContinualOutputs:
        params = bind_noise_domain(self.params, records)
        bounded = bool(getattr(records, "is_bounded", True))
        if params.event_time and bounded and params.clock.last_step is None:
            raise ValueError("a batch replay with event-time steps needs a public end: StepClock(..., end=...)")
        unit_dead = []
        if params.privacy_unit is not None:  # at most max_records records per unit, the id hashed and dropped
            records, bad_units = records | "BoundUnits" >> BoundUnitRecords(params.privacy_unit, params.noise_key)
            unit_dead.append(bad_units)
        parsed = records | "Parse" >> beam.ParDo(ParseRecords(params)).with_output_types(
            Tuple[str, Any]).with_outputs(DEAD_LETTER, main="records")
        items = parsed.records
        if params.streams:
            declared = records.pipeline | "DeclareStreams" >> beam.Create(
                [(s, (0, None, None)) for s in params.streams]).with_output_types(Tuple[str, Any])
            items = (items, declared) | "WithDeclared" >> beam.Flatten()
        released = release_stage(items, params, "Release", bounded)
        rows = released.rows | "Rows" >> beam.Map(release_labels(params)).with_output_types(ReleaseRow)
        dead = (*unit_dead, parsed[DEAD_LETTER], released[DEAD_LETTER]) | "DeadLetters" >> beam.Flatten()
        return ContinualOutputs(rows, dead)


class OnlineLearner(_LearnerTransform):
    """Private online learning with privacy expiration (WDP-COCOP / WDP-COCOL), one record per step
    per stream; releases the next decision variable ``{"x": x̂_{t+1}}`` at every step.

    Guarantee: window ε-DP or (ε, δ)-DP over the last ``B >= window`` records of each stream
    (event level); expired records are effectively published. Public: the stream set, the arrival
    order and count of records, release times.

    Args:
        params: a :class:`OnlineLearnerParams` (every privacy parameter, checked at its construction).
        label: the transform's label (default None: Beam's); it names the noise domain when
            ``params.noise_key.domain`` is unset.
        privacy_unit: a :class:`~beam_dp.core.group_privacy.RecordUnit`: protect one unit's at most
            ``max_records`` records (see the module docstring). Default None: one record.
    """

    params_type = OnlineLearnerParams


class IncrementalRegression(_LearnerTransform):
    """Private incremental least-squares regression (PRIVINCREG₁/₂, PRIVINCERM) per stream;
    releases ``{"theta": θ_t}`` every ``release_every`` steps. Guarantee: (ε, δ)-DP, event level
    (one record), over the whole stream (or its declared horizon). Public: stream set, step
    schedule (and record counts for count steps), release times.

    Args:
        params: a :class:`IncrementalRegressionParams` (every privacy parameter, checked at its construction).
        label: the transform's label (default None: Beam's); it names the noise domain when
            ``params.noise_key.domain`` is unset.
        privacy_unit: as :class:`OnlineLearner`'s.
    """

    params_type = IncrementalRegressionParams
