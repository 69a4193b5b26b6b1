"""Beam transforms of the ERM family: privately trained model snapshots released from streams (guide:
``docs/erm.md``).

* ``MultiResolutionRelease`` — Algorithm 2 (Algorithm 6 with ``sampling=True``): models on dyadic
  blocks of B elements, released when each block closes.
* ``ContinualModelRelease`` — Algorithm 4 (Algorithm 8 with ``sampling=True``; also the paper's
  ``"basic"`` release and the ``"independent"`` per-block baseline): a model over the whole stream
  so far, every b0 elements from t = B on.
* ``SlidingWindowModelRelease`` — Algorithm 5 (PSWERM): a model over the last w = (2^k − 1)·w0
  elements, every w0 elements.

Elements: ``(stream_id, features, label)`` tuples, or mappings / ``beam.Row``s with fields
``stream_id``, ``features``, ``label``, or :class:`~beam_dp.steps.columns.LabelledColumns` blocks of
them (a file's batch, validated in vectorised passes with the same dead letters per row). Steps are
**count steps** (blocks of b0, B or w0 valid elements in arrival order per stream): the arrival count per
stream is public and Beam does not fix the order of elements within a key. Invalid elements (features of
the wrong width, NaN/inf, labels outside ``classes``, bad stream ids) go to ``dead_letter`` and do not count.

Each transform returns ``ContinualOutputs(releases, dead_letter)``; a release row's value holds
the model's ``weights`` and ``intercepts`` (``parts``), and its meta the data range covered, the
regulariser chain, every training call (for the per-element ledger), ε/δ spent and ``certified``.
``beam_dp.io.load_model(row)`` turns a row back into a predictor.

With ``privacy_unit=`` (a :class:`~beam_dp.core.group_privacy.RecordUnit`) each release protects one
privacy unit's whole contribution of at most ``max_records`` examples, by group privacy over the chain of
its record substitutions, calibrated at the record-level budget
:func:`~beam_dp.core.group_privacy.record_budget` gives (``docs/erm.md``, "Privacy units"). On a batch
replay and a streaming job alike: the unit stage keeps each unit's first ``max_records`` examples by
arrival (one count per unit in keyed state, no timers), so it delays no release.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Literal, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.pvalue import PCollection

from beam_dp.beam.shell.batch_release import release_stage
from beam_dp.beam.shell.blocks import BundleBlocks, ColumnarParse, RecordColumns, by_record, stack_rows
from beam_dp.beam.shell.domains import bind_noise_domain, release_labels
from beam_dp.beam.shell.outputs import ContinualOutputs
from beam_dp.beam.shell.parse import DEAD_LETTER
from beam_dp.beam.shell.unit_records import BoundUnitRecords, with_record_unit
from beam_dp.core.budget import BudgetShare, check_params_budget
from beam_dp.core.group_privacy import RecordUnit, check_unit_share
from beam_dp.core.limits import (
    EPSILON_RANGE,
    LAMBDA_RANGE,
    MAX_DIM,
    MAX_SCALE,
    MIN_SCALE,
    check_count,
    check_delta,
    check_number,
)
from beam_dp.mechanisms.erm import (
    ContinualReleaseMechanism,
    HuberRegression,
    LabelledRows,
    LinearModel,
    MultiResolutionMechanism,
    SlidingWindowMechanism,
    SoftmaxRegression,
)
from beam_dp.steps.columns import LabelledColumns
from beam_dp.steps.events import DeadLetter, coerce_value, split_event, value_letter
from beam_dp.steps.params import NoiseKey, check_streams
from beam_dp.steps.schema import ReleaseRow

__all__ = [
    "BAD_LABEL",
    "ContinualModelParams",
    "ContinualModelRelease",
    "MultiResolutionParams",
    "MultiResolutionRelease",
    "SlidingWindowModelParams",
    "SlidingWindowModelRelease",
]

BAD_LABEL = "bad_label"


@dataclass(frozen=True)
class _ERMParams:
    """Model, privacy and stream parameters shared by the ERM transforms (``docs/erm.md``).

    Args:
        n_features: the feature dimension ``d`` (integer in ``[1, 10^7]``; default 1).
        classes: the public class labels: multiclass logistic regression; default None: Huber ("ridge")
            regression with threshold ``huber``. Other labels are dead-lettered.
        lam: the L2 regularisation ``λ`` (in ``[1e-12, 1e12]``; default 1.0); the sensitivity scales as
            ``1/λ``.
        epsilon: ``ε`` (in ``[1e-9, 1e9]``) of each element over the whole stream (default 1.0).
        delta: ``δ`` (default 0.0): 0 with ``noise="gamma"``, in ``(0, 1)`` with ``"gaussian"``.
        noise: ``"gamma"`` (default: K-norm noise, pure ε-DP) or ``"gaussian"`` ((ε, δ)-DP).
        clip_bound: features are clipped to L2 norm ``clip_bound`` (> 0; default 1.0): it sets the
            Lipschitz constant ``L`` the noise is calibrated for.
        huber: the Huber threshold of the regression loss (> 0; default 1.0).
        backend: the certified solver: ``"numpy"`` (default), ``"torch"`` or ``"auto"``; the guarantee is
            the same.
        uncertified: train with replication SGD under the spec's sensitivity ``2L/(λn)``, releases marked
            ``certified=False`` (default False: the certified solver, whose tolerance the sensitivity counts).
        granularity: release models on the power-of-two grid ``>= granularity`` (in ``(0, clip_bound]``)
            with exact arithmetic, the sensitivity grown by ``sqrt(d)·g``; default None: raw floats.
        streams, noise_key, budget: the step fields of :class:`~beam_dp.steps.params.StepParams` (count steps
            only: no clock, lateness or restore).
        privacy_unit: the :class:`~beam_dp.core.group_privacy.RecordUnit` every release protects (default None:
            one example); set by ``with_record_unit`` (or the transform's ``privacy_unit=``), with ``epsilon``,
            ``delta`` the record-level budget and ``budget`` the unit's share.
    """

    n_features: int = 1
    classes: tuple | None = None
    lam: float = 1.0
    epsilon: float = 1.0
    delta: float = 0.0
    noise: Literal["gamma", "gaussian"] = "gamma"
    clip_bound: float = 1.0
    huber: float = 1.0
    backend: Literal["numpy", "torch", "auto"] = "numpy"
    uncertified: bool = False
    # release models on the power-of-two grid >= granularity with exact arithmetic (Δ(n) grows by sqrt(d)·g)
    granularity: float | None = None
    streams: tuple[str, ...] | None = None
    noise_key: NoiseKey = field(default_factory=NoiseKey)
    budget: BudgetShare | None = None  # this transform's share of its job's budget (**share.params())
    privacy_unit: RecordUnit | None = None  # the unit protected (with_record_unit); None: one example

    clock = None  # the driver contract: count steps only, no grace, nothing to restore
    allowed_lateness = 0.0
    restore_states = None

    def _check(self) -> None:
        check_count("n_features", self.n_features, 1, MAX_DIM)
        check_number("epsilon", self.epsilon, *EPSILON_RANGE)
        check_delta(self.delta)
        check_number("lam", self.lam, *LAMBDA_RANGE)
        check_number("clip_bound", self.clip_bound, MIN_SCALE, MAX_SCALE)
        check_number("huber", self.huber, MIN_SCALE, MAX_SCALE)
        if self.granularity is not None:
            check_number("granularity", self.granularity, MIN_SCALE, self.clip_bound)
        for name in ("block", "update", "base", "window", "max_level"):  # the step sizes of the subclasses
            if getattr(self, name, None) is not None:
                check_count(name, getattr(self, name))
        if hasattr(self, "base_fraction"):
            check_number("base_fraction", self.base_fraction, 0.0, 1.0, low_open=True)
        if self.classes is not None:
            object.__setattr__(self, "classes", tuple(self.classes))
        check_streams(self)
        check_unit_share(self.privacy_unit, self.budget)
        check_params_budget(self, self.build_mechanism())  # validates everything (ValueError)

    def model(self) -> LinearModel:
        if self.classes is not None:
            return SoftmaxRegression(n_features=self.n_features, clip_bound=self.clip_bound,
                                     n_classes=len(self.classes), labels=self.classes)
        return HuberRegression(n_features=self.n_features, clip_bound=self.clip_bound, huber=self.huber)

    def _common(self) -> dict:
        return dict(model=self.model(), lam=self.lam, epsilon=self.epsilon, delta=self.delta, noise=self.noise,
                    backend=self.backend, uncertified=self.uncertified, granularity=self.granularity)


@dataclass(frozen=True)
class MultiResolutionParams(_ERMParams):
    """Algorithm 2 / 6: models on dyadic blocks of ``B`` elements (``docs/erm.md``).

    Args:
        block: ``B``: elements per step (>= 1; default 1024).
        max_level: the highest dyadic level released (>= 1; default None: unbounded, and the state keeps the
            whole prefix); it bounds the rows kept in state, not the guarantee.
        sampling: Algorithm 6 (``noise="gamma"`` only): level ``k`` trains on a Bernoulli sample at a
            smaller scale (default False).
        n_features, classes, lam, epsilon, delta, noise, clip_bound, huber, backend, uncertified,
            granularity, streams, noise_key, budget, privacy_unit: the model, privacy and stream fields every ERM params
            shares (``_ERMParams``; count steps only: no clock, lateness or restore).
    """

    block: int = 1024
    max_level: int | None = None
    sampling: bool = False

    def __post_init__(self) -> None:
        self._check()

    @property
    def block_size(self) -> int:
        return self.block

    def build_mechanism(self) -> MultiResolutionMechanism:
        return MultiResolutionMechanism(block=self.block, max_level=self.max_level, sampling=self.sampling,
                                        **self._common())


@dataclass(frozen=True)
class ContinualModelParams(_ERMParams):
    """Algorithm 4 / 8: a model over the whole stream so far, every ``b0`` elements from ``B`` on
    (``docs/erm.md``).

    Args:
        update: ``b0``: elements per step (>= 1, dividing ``base``; default 1024).
        base: ``B``: elements before the first release (>= 1; default 8192).
        variant: ``"cumulative"`` (default, Algorithm 4), ``"basic"`` (the paper's basic release) or
            ``"independent"`` (the per-block baseline: each block trained alone at ε).
        sampling: Algorithm 8 (``variant="cumulative"``, ``noise="gamma"`` only; default False).
        base_fraction: ``f`` in ``(0, 1)`` (default 0.5): ε splits into ``f·ε`` for the prefix models and
            ``(1 − f)·ε`` for the updates; every element's spend stays below ε.
        n_features, classes, lam, epsilon, delta, noise, clip_bound, huber, backend, uncertified,
            granularity, streams, noise_key, budget, privacy_unit: the model, privacy and stream fields every ERM params
            shares (``_ERMParams``; count steps only: no clock, lateness or restore).
    """

    update: int = 1024
    base: int = 8192
    variant: Literal["cumulative", "basic", "independent"] = "cumulative"
    sampling: bool = False
    base_fraction: float = 0.5

    def __post_init__(self) -> None:
        self._check()

    @property
    def block_size(self) -> int:
        return self.update

    def build_mechanism(self) -> ContinualReleaseMechanism:
        return ContinualReleaseMechanism(update=self.update, base=self.base, variant=self.variant,
                                         sampling=self.sampling, base_fraction=self.base_fraction, **self._common())


@dataclass(frozen=True)
class SlidingWindowModelParams(_ERMParams):
    """Algorithm 5 (PSWERM): a model over the last ``w`` elements, every ``w0`` (``docs/erm.md``).

    Args:
        window: ``w = (2^k − 1)·block`` elements (default ``7·1024``).
        block: ``w0``: elements per step (>= 1; default 1024).
        sampling: the fine-tuning sampling variant (``noise="gamma"`` only; default False).
        n_features, classes, lam, epsilon, delta, noise, clip_bound, huber, backend, uncertified,
            granularity, streams, noise_key, budget, privacy_unit: the model, privacy and stream fields every ERM params
            shares (``_ERMParams``; count steps only: no clock, lateness or restore).
    """

    window: int = 7 * 1024
    block: int = 1024
    sampling: bool = False

    def __post_init__(self) -> None:
        self._check()

    @property
    def block_size(self) -> int:
        return self.block

    def build_mechanism(self) -> SlidingWindowMechanism:
        levels = SlidingWindowMechanism.window_levels(self.window, self.block)
        return SlidingWindowMechanism(block=self.block, levels=levels, sampling=self.sampling, **self._common())


class ParseLabelledExamples(ColumnarParse, beam.DoFn):
    """Validate labelled examples (one by one, or a ``LabelledColumns`` block at once:
    :func:`~beam_dp.beam.shell.blocks.column_rows`); emit their blocks ``(stream, (None, LabelledRows,
    elements))`` (a bundle's valid examples of one stream in arrival order,
    :class:`~beam_dp.beam.shell.blocks.BundleBlocks`) or a dead letter per bad one. The value never appears
    in a dead letter's ``detail``."""

    MAX_ROWS = 4096  # rows per block: a bundle's examples of one stream leave in blocks of at most this
    rows_type = LabelledRows  # a columnar block's valid rows of one stream

    def __init__(self, params: _ERMParams):
        self._params = params

    def setup(self) -> None:
        self._n_features = self._params.n_features
        self._classes = None if self._params.classes is None else {c: i for i, c in enumerate(self._params.classes)}
        self._label_dtype = np.float64 if self._classes is None else np.int64
        self._streams = frozenset(self._params.streams) if self._params.streams is not None else None
        namespace = f"beam_dp/{self._params.build_mechanism().name}"
        self._elements = Metrics.counter(namespace, "elements")
        self._dead = Metrics.counter(namespace, "dead_letters")

    def start_bundle(self) -> None:
        self._blocks = BundleBlocks(_labelled_rows, self.MAX_ROWS)

    def finish_bundle(self) -> Iterator:
        yield from self._blocks.flush()

    def _dead_letter(self, reason: str, detail: str, stream: str | None, element: Any, source: str | None = None):
        self._dead.inc()
        return beam.pvalue.TaggedOutput(DEAD_LETTER, DeadLetter(reason, detail, stream, element, source))

    def _label(self, label: Any) -> int | float:
        if self._classes is not None:
            try:
                return self._classes[label]
            except (KeyError, TypeError):
                raise ValueError("label is not one of the declared classes") from None
        if isinstance(label, (bool, str, bytes)) or label is None:
            raise ValueError("label must be a number")
        value = float(label)
        if not np.isfinite(value):
            raise ValueError("label is not finite")
        return value

    def process(self, element: Any, timestamp=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam) -> Iterator:
        if isinstance(element, LabelledColumns):
            yield from self._process_columns(element, timestamp, window)
        elif isinstance(element, RecordColumns):  # examples read one by one from a file: letters name their record
            yield from by_record(element, lambda row, original: self._one(row, timestamp, window, original))
        else:
            yield from self._one(element, timestamp, window, element)

    def _one(self, element: Any, timestamp: Any, window: Any, original: Any) -> Iterator:
        """One example; ``original``: what stands for it in its block (a one-row block knowing its source)."""
        checked = self._check(element)
        if isinstance(checked, DeadLetter):
            yield self._dead_letter(*checked)
            return
        stream, row = checked
        self._elements.inc()
        yield from self._blocks.add(stream, row, original, timestamp, window)

    def _check(self, element: Any) -> tuple[str, tuple] | DeadLetter:
        """One element -> ``(stream, (features, label index or value))`` or its dead letter."""
        head = split_event(element, ("features", "label"), None, self._streams)  # count steps: no timestamp
        if isinstance(head, DeadLetter):
            return head
        stream, _, _, (features, label) = head
        try:
            x = coerce_value(features, self._n_features, "features")
        except ValueError as exc:
            return value_letter(exc, stream, element)
        try:
            y = self._label(label)
        except (ValueError, TypeError) as exc:
            return DeadLetter(BAD_LABEL, str(exc), stream, element)
        return stream, (x, y)

    def _vector(self, block: LabelledColumns, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows of ``block`` whose features and label pass :meth:`_check`, checked at once."""
        x = block.features[rows]
        if x.shape[1:] != (self._n_features,):
            return np.zeros(len(rows), dtype=bool), np.zeros((0, self._n_features)), np.zeros(0, self._label_dtype)
        ok = np.isfinite(x).all(axis=1)
        if self._classes is None and block.label_names is None:  # numbers: _label's finite check
            y = block.labels[rows].astype(np.float64)
            ok &= np.isfinite(y)
        else:  # class labels (or numbers checked as labels): _label once per distinct label
            if block.label_names is not None:
                names, codes = block.label_names, block.labels[rows]
            else:
                floats, codes = np.unique(block.labels[rows], return_inverse=True)
                names = floats.tolist()
            values, good = _per_label(self._label, names, self._label_dtype)
            y, ok = values[codes], ok & good[codes]
        return ok, x[ok], y[ok]


def _per_label(label: Callable[[Any], Any], names: Any, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """``label(name)`` of each distinct label (0 where refused), and whether it was accepted."""
    values, good = [], []
    for name in names:
        try:
            values.append(label(name))
            good.append(True)
        except (ValueError, TypeError):
            values.append(0)
            good.append(False)
    return np.array(values, dtype=dtype), np.array(good, dtype=bool)


def _labelled_rows(stream: str, rows: list, originals: tuple) -> list:
    """The validated ``(features, label)`` rows of one stream as one block, in arrival order."""
    return [(stream, (None, stack_rows(rows, LabelledRows, tuple), originals))]


class _ERMRelease(beam.PTransform):
    params_type: type = _ERMParams

    def __init__(self, params: _ERMParams, label: str | None = None, privacy_unit: RecordUnit | None = None):
        super().__init__(label)
        if not isinstance(params, self.params_type):
            raise TypeError(f"{type(self).__name__} takes a {self.params_type.__name__}")
        self.params = params if privacy_unit is None else with_record_unit(params, privacy_unit)

    def expand(self, events: PCollection) -> ContinualOutputs:
        params = bind_noise_domain(self.params, events)
        unit_dead: list[PCollection] = []
        if params.privacy_unit is not None:  # at most max_records examples per unit, the id hashed and dropped
            events, bad_units = events | "BoundUnits" >> BoundUnitRecords(params.privacy_unit, params.noise_key)
            unit_dead.append(bad_units)
        parsed = events | "Parse" >> beam.ParDo(ParseLabelledExamples(params)).with_output_types(
            Tuple[str, Any]).with_outputs(DEAD_LETTER, main="examples")
        examples = parsed.examples
        if params.streams:
            declared = events.pipeline | "DeclareStreams" >> beam.Create(
                [(s, (0, None, None)) for s in params.streams]).with_output_types(Tuple[str, Any])
            examples = (examples, declared) | "WithDeclared" >> beam.Flatten()
        released = release_stage(examples, params, "Release", bool(getattr(events, "is_bounded", True)),
                                 per_step_timers=False)
        rows = released.rows | "Rows" >> beam.Map(release_labels(params)).with_output_types(ReleaseRow)
        dead = (*unit_dead, parsed[DEAD_LETTER], released[DEAD_LETTER]) | "DeadLetters" >> beam.Flatten()
        return ContinualOutputs(rows, dead)


class MultiResolutionRelease(_ERMRelease):
    """Algorithm 2/6 per stream. ε-DP (or (ε, δ)) per element, forever; see ``MultiResolutionMechanism``.

    Args:
        params: a :class:`MultiResolutionParams` (every privacy parameter, checked at its construction).
        label: the transform's label (default None: Beam's); it names the noise domain when
            ``params.noise_key.domain`` is unset.
        privacy_unit: protect this :class:`~beam_dp.core.group_privacy.RecordUnit` (the examples carry its
            field; a tuple its id as a 4th item) instead of one example (default None).
    """

    params_type = MultiResolutionParams


class ContinualModelRelease(_ERMRelease):
    """Algorithm 4/8 per stream (base + updates at total ε). See ``ContinualReleaseMechanism``.

    Args:
        params: a :class:`ContinualModelParams` (every privacy parameter, checked at its construction).
        label: the transform's label (default None: Beam's); it names the noise domain when
            ``params.noise_key.domain`` is unset.
        privacy_unit: protect this :class:`~beam_dp.core.group_privacy.RecordUnit` (the examples carry its
            field; a tuple its id as a 4th item) instead of one example (default None).
    """

    params_type = ContinualModelParams


class SlidingWindowModelRelease(_ERMRelease):
    """Algorithm 5 (PSWERM) per stream, ε-DP (or (ε, δ)) per element forever. See ``SlidingWindowMechanism``.

    Args:
        params: a :class:`SlidingWindowModelParams` (every privacy parameter, checked at its construction).
        label: the transform's label (default None: Beam's); it names the noise domain when
            ``params.noise_key.domain`` is unset.
        privacy_unit: protect this :class:`~beam_dp.core.group_privacy.RecordUnit` (the examples carry its
            field; a tuple its id as a 4th item) instead of one example (default None).
    """

    params_type = SlidingWindowModelParams
