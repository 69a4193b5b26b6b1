"""Public transforms: ``ContinualSum``, ``ContinualCount``, ``WindowedSum`` (guide: ``docs/sums.md``).

Each takes a frozen params dataclass and returns a :class:`ContinualOutputs` with two
PCollections: ``releases`` (schema'd :class:`~beam_dp.io.ReleaseRow`, one per stream per step)
and ``dead_letter`` (:class:`~beam_dp.steps.events.DeadLetter`: reason, value-free detail, element).

Shape of the pipeline::

    events ─ Parse (validate, step, clip) ─┬─ dead_letter
                                            └─ [batch: CombinePerKey((stream, step))] ─ stateful DoFn ─ releases

On a bounded input (batch replay) contributions are pre-aggregated per (stream, step) by a
lifted combiner (keyed by stream groups: summed per bundle in Parse itself, and the bundles' blocks of
a step added as the release stage takes them), so the mechanism sees one block per step. On an unbounded
input each contribution reaches the stateful DoFn on its own, so a late one can be dead-lettered whole; an
on-time one is merged into its step's sum in state as it arrives (``beam_dp.beam.shell.dofn.SummingBuffer``: one sum per
open step, O(d), whatever the number of events).

With ``params.stream_groups`` the stateful DoFn is keyed by group of streams
(``beam_dp.mechanisms.stream_groups``): blocks are per (group, step), each group steps in one numpy
operation, and ``releases`` is a PCollection of :class:`~beam_dp.io.ReleaseColumns` (one per group and
step; the same releases and values as keyed by stream). Write them with the sinks' ``columnar=True``,
turn them into rows with ``beam.FlatMap(ReleaseColumns.rows)`` or into Arrow tables with
:func:`~beam_dp.io.release_table`.

With ``privacy_unit=`` (a :class:`PrivacyUnit`, or params from ``params.with_privacy_unit``; event time)
every release protects one privacy unit's whole bounded contribution instead of one event: Parse is
replaced by the unit stages (hash, key by unit, bound: ``beam_dp.beam.shell.units`` on a batch replay,
``beam_dp.beam.shell.units_streaming`` on a stream, each unit's steps closed by the watermark; both keep
the same contributions) and the noise is calibrated at the unit level (``docs/privacy_units.md``).
Without it nothing changes.

The frozen params dataclasses (in the spirit of PipelineDP's AggregateParams) validate everything and
build the mechanism once, so invalid privacy parameters raise ``ValueError`` before a pipeline is built.
Steps come from exactly one of ``clock`` (event-time steps; a batch replay needs its public ``end``) or
``block_size`` (count steps of b0 contributions in arrival order; an incomplete final block is never released).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.pvalue import PCollection

from beam_dp.beam.shell.batch_release import release_stage
from beam_dp.beam.shell.domains import bind_noise_domain, release_labels
from beam_dp.beam.shell.outputs import ContinualOutputs
from beam_dp.beam.shell.parse import DEAD_LETTER, MergeClippedSums, ParseEvents
from beam_dp.beam.shell.units import UNIT_BUCKETS, BoundUnits, UnitEventBatch, UnitEvents
from beam_dp.beam.shell.units_streaming import BoundUnitStream
from beam_dp.core.budget import check_params_budget
from beam_dp.core.clock import StepClock
from beam_dp.core.limits import check_count, check_noise_std
from beam_dp.mechanisms.base import ClippedSum, ContinualSumMechanism, SumSpec
from beam_dp.mechanisms.stream_groups import GroupBlock, group_key, group_of
from beam_dp.mechanisms.sums.snapping import SnappedSum
from beam_dp.mechanisms.sums.unit_level import PrivacyUnit, UnitFactor, unit_factor
from beam_dp.steps.events import EventBatch
from beam_dp.steps.params import NoiseKey, StepParams, check_idle, check_stream_groups
from beam_dp.steps.schema import ReleaseColumns, ReleaseRow

__all__ = ["ContinualCount", "ContinualCountParams", "ContinualOutputs", "ContinualSum", "ContinualSumParams",
           "NoiseKey", "PrivacyUnit", "WindowedSum", "WindowedSumParams"]

def _public_end(clock: StepClock | None) -> int | None:
    """The clock's public last step (a horizon for the non-tree counters), if it has one."""
    return None if clock is None else clock.last_step


@dataclass(frozen=True)
class _VectorSumParams(StepParams):
    dim: int = 1
    epsilon: float = 1.0
    clip_bound: float = 1.0
    delta: float = 0.0
    noise: Literal["gamma", "gaussian"] = "gamma"
    #: Gaussian noise: "analytic" (the smallest exact sigma) or "paper" (the paper's closed form, certified)
    calibration: Literal["paper", "analytic"] = "analytic"
    #: key the engine by this many groups of streams (a public, stable hash of the stream name): one
    #: state and timer per group, the group stepped in one numpy operation, releases as Arrow tables;
    #: None keys by stream. Releases do not depend on it (noise is keyed per stream).
    stream_groups: int | None = None
    #: the idle rule, both or neither (event time, keyed by stream): a stream ends (``stream_ended``, its
    #: state freed) after its own step t >= idle_steps at which its released prefix sums moved by
    #: ||release_t - release_{t-k}||_2 <= idle_threshold (the values' units). Decided from the releases
    #: alone: post-processing, no privacy cost (docs/steps.md, rule 6).
    idle_steps: int | None = None
    idle_threshold: float | None = None

    def sum_spec(self, clip_bound: float | None = None) -> SumSpec:
        """The mechanism parameters, checked (``SumSpec``: ``beam_dp.core.limits``) before the mechanism is
        built; ``clip_bound`` replaces R (a snapped sum calibrates for an enlarged one)."""
        return SumSpec(dim=self.dim, epsilon=self.epsilon, clip_bound=self.clip_bound if clip_bound is None else clip_bound,
                       delta=self.delta, noise=self.noise, calibration=self.calibration)

    def _validate_noise(self, mechanism: ContinualSumMechanism, last_step: int | None) -> None:
        """Refuse parameters whose release noise overflows float64, at the first and the last public step.
        (Any granularity works: snapped units are exact integers at any size, beam_dp.core.grid.)"""
        with np.errstate(all="ignore"):
            for t in {1, last_step or 1}:
                try:
                    std = math.sqrt(mechanism.noise_var(t))
                except (OverflowError, ZeroDivisionError, FloatingPointError):
                    std = math.inf
                check_noise_std(std, f"epsilon={self.epsilon!r}, delta={self.delta!r}, clip_bound={self.clip_bound!r}")

    def with_privacy_unit(self, unit: PrivacyUnit) -> "_VectorSumParams":
        """These params at the unit level: every release protects one privacy unit's whole bounded
        contribution (``unit``) as these params protect one event (``docs/privacy_units.md``)."""
        if not isinstance(unit, PrivacyUnit):
            raise TypeError(f"privacy_unit must be a PrivacyUnit, got {type(unit).__name__}")
        try:
            unit_class = _UNIT_LEVEL[type(self)]
        except KeyError:
            raise TypeError(f"{type(self).__name__} has no unit-level form") from None
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return unit_class(**fields, privacy_unit=unit)

    def _snapped(self, make: Callable[[SumSpec], ContinualSumMechanism],
                 inputs_on_grid: bool = False) -> ContinualSumMechanism:
        """``make(spec)``, wrapped in a ``SnappedSum`` when a granularity is set."""
        if self.granularity is None or (inputs_on_grid and self.noise == "discrete_laplace"):
            return make(self.sum_spec())  # (integer noise on integer counts is already exact on the grid)
        return SnappedSum(lambda bound: make(self.sum_spec(bound)), clip_bound=self.clip_bound,
                          granularity=self.granularity, inputs_on_grid=inputs_on_grid)


@dataclass(frozen=True)
class ContinualSumParams(_VectorSumParams):
    """Private running sums of vectors per stream, forever (``docs/sums.md``).

    Guarantee: ε-DP (``noise="gamma"``) or (ε, δ)-DP (``"gaussian"``) for each contribution (event level,
    replace-one), over the whole stream.

    Args:
        clock, block_size, streams, noise_key, restore_states, granularity, budget, allowed_lateness: the
            step fields of :class:`~beam_dp.steps.params.StepParams`.
        dim: the vector dimension ``d`` of each contribution (integer in ``[1, 10^7]``; default 1).
        epsilon: the privacy loss ``ε`` of each contribution over the whole stream (in ``[1e-9, 1e9]``;
            default 1.0).
        clip_bound: ``R``: each contribution is clipped to L2 norm ``R`` (the values' units, > 0; default 1.0);
            the noise is calibrated for the replace-one sensitivity ``2R``.
        delta: ``δ`` (default 0.0): 0 with ``noise="gamma"`` (pure ε-DP), in ``(0, 1)`` with ``"gaussian"``.
        noise: ``"gamma"`` (default: Gamma/K-norm noise, ε-DP) or ``"gaussian"`` ((ε, δ)-DP).
        calibration: Gaussian noise of the ``"tree"`` counter and the window tree: ``"analytic"`` (default, the
            smallest exact sigma) or ``"paper"`` (the paper's closed form, certified); other counters are exact.
        stream_groups: key the engine by this many groups of streams (``[1, 2^20]``, a public stable hash of
            the stream id; event time only): one state and timer per group, releases as ``ReleaseColumns``.
            Default None: keyed by stream. Releases and privacy do not depend on it.
        idle_steps: ``k``: with ``idle_threshold`` (both or neither; event time, keyed by stream), a stream
            ends (``stream_ended``, state freed) after its step ``t >= k`` at which its released sums moved by
            ``||release_t - release_{t-k}||_2 <= idle_threshold``. Decided from releases alone: no privacy cost.
            Default None.
        idle_threshold: ``τ`` of the idle rule (the values' units, >= 0; default None).
        horizon: the public number of steps (>= 1; the clock's steps must fit), or None (default): the
            ``"tree"`` counter runs unbounded, the others fall back to the clock's public end, else their
            unbounded mode.
        unbounded: the ``"tree"`` counter without a horizon: ``"hybrid"`` (default) or ``"doubling"``.
        counter: the mechanism (``beam_dp.mechanisms.sums.make_counter``): ``"auto"`` (default: the BLT for
            Gaussian noise, the fitted k-ary Honaker tree for Gamma), ``"tree"``, ``"honaker"``,
            ``"toeplitz"`` (needs a horizon), ``"blt"`` or ``"kary"``. Same guarantee for every counter.
        blt_error: the BLT's shipped fit: ``"max"`` (default, minimal max per-step variance) or ``"mean"``
            (minimal mean per-step variance over the horizon; the BLT counter only).
    """

    horizon: int | None = None
    unbounded: Literal["hybrid", "doubling"] = "hybrid"
    counter: str = "auto"
    blt_error: Literal["max", "mean"] = "max"  # the BLT's fit: minimal max or mean per-step variance

    # Only the unit contributions of ContinualCount are integers; a real-valued sum plus integer noise
    # would release its fractional part exactly, so ContinualSum refuses discrete_laplace.
    _integer_contributions: ClassVar[bool] = False

    def __post_init__(self) -> None:
        self._validate_steps()
        if self.noise == "discrete_laplace" and not self._integer_contributions:
            raise ValueError(
                "noise='discrete_laplace' is for ContinualCount only: a non-integer sum plus integer noise "
                "would leak its fractional part"
            )
        self.sum_spec()
        if self.horizon is not None:
            check_count("horizon", self.horizon)
        if self.horizon is not None and self.clock is not None and self.clock.last_step is not None:
            if self.clock.last_step > self.horizon:
                raise ValueError(f"the clock has {self.clock.last_step} steps but horizon is {self.horizon}")
        mechanism = self.build_mechanism()
        self._validate_noise(mechanism, self.horizon or _public_end(self.clock))
        check_stream_groups(self, mechanism)
        check_idle(self, mechanism)
        check_params_budget(self, mechanism)

    def build_mechanism(self):
        from beam_dp.mechanisms.sums import make_counter

        def make(spec: SumSpec):
            return make_counter(self.counter, horizon=self.horizon, unbounded=self.unbounded,
                                public_end=_public_end(self.clock), blt_error=self.blt_error, **spec.keywords())

        # a count's steps are integers, already on any grid g <= 1: snapping them costs no sensitivity
        return self._snapped(make, inputs_on_grid=self._integer_contributions and (self.granularity or 1.0) <= 1.0)


@dataclass(frozen=True)
class _UnitCountSumParams(ContinualSumParams):
    """``ContinualSumParams`` of a count (every contribution is exactly 1, R = 1): the one place the
    integer law ``noise="discrete_laplace"`` is admitted."""

    _integer_contributions: ClassVar[bool] = True


@dataclass(frozen=True)
class WindowedSumParams(_VectorSumParams):
    """Private running sums with privacy expiration (window tree; ``docs/sums.md``).

    Args:
        clock, block_size, streams, noise_key, restore_states, granularity, budget, allowed_lateness: the
            step fields of :class:`~beam_dp.steps.params.StepParams`.
        dim, epsilon, clip_bound, delta, noise, calibration, stream_groups, idle_steps, idle_threshold: as
            ``ContinualSumParams`` (ε and δ hold for each contribution while it is inside the window).
        window: ``W`` in steps (>= 1, rounded up to a power of two; default 1): each contribution is
            protected (ε or (ε, δ)) while fewer than ``W`` later steps have been released; afterwards it
            appears un-noised in later releases (window DP).
    """

    window: int = 1

    def __post_init__(self) -> None:
        self._validate_steps()
        self.sum_spec()
        mechanism = self.build_mechanism()
        self._validate_noise(mechanism, _public_end(self.clock))
        check_stream_groups(self, mechanism)
        check_idle(self, mechanism)
        check_params_budget(self, mechanism)

    def build_mechanism(self):
        from beam_dp.mechanisms.sums.window_tree import WindowTreeSum

        return self._snapped(lambda spec: WindowTreeSum(spec, window=self.window))


@dataclass(frozen=True)
class ContinualCountParams(StepParams):
    """Private running counts of events per stream: a continual sum of 1 per event (R = 1, so
    Δ₂ = 2 under replace-one neighbours; ``docs/sums.md``). Same mechanisms (``counter``) and guarantees
    as ``ContinualSumParams``.

    Args:
        clock, block_size, streams, noise_key, restore_states, budget, allowed_lateness: the step fields of
            :class:`~beam_dp.steps.params.StepParams`.
        granularity: default 1.0: counts released as exact integers (integer steps plus data-independent
            noise rounded to the integers, ``SnappedSum``; the guarantee is the counter's own). None: the raw
            float estimate.
        epsilon: the privacy loss ``ε`` of each event over the whole stream (default 1.0).
        delta: ``δ`` (default 0.0): 0 for pure ε-DP noise, in ``(0, 1)`` with ``"gaussian"``.
        noise: ``"gamma"`` (default, ε-DP), ``"gaussian"`` ((ε, δ)-DP) or ``"discrete_laplace"`` (the trees'
            exact integer sampler at their Gamma scales, pure ε; ``counter`` ``"auto"`` or ``"tree"``).
        calibration: as ``ContinualSumParams.calibration`` (default ``"analytic"``).
        horizon, unbounded, counter, blt_error: as ``ContinualSumParams``.
        stream_groups: as ``ContinualSumParams.stream_groups`` (needs ``granularity=None``; default None).
    """

    granularity: float | None = 1.0
    epsilon: float = 1.0
    delta: float = 0.0
    noise: Literal["gamma", "gaussian", "discrete_laplace"] = "gamma"
    calibration: Literal["paper", "analytic"] = "analytic"
    horizon: int | None = None
    unbounded: Literal["hybrid", "doubling"] = "hybrid"
    counter: str = "auto"
    blt_error: Literal["max", "mean"] = "max"  # as ContinualSumParams.blt_error
    stream_groups: int | None = None  # as ContinualSumParams.stream_groups (needs granularity=None)

    def __post_init__(self) -> None:
        self._validate_steps()
        self.as_sum_params()

    def as_sum_params(self) -> ContinualSumParams:
        return _UnitCountSumParams(
            clock=self.clock, block_size=self.block_size, streams=self.streams, noise_key=self.noise_key,
            restore_states=self.restore_states, granularity=self.granularity, allowed_lateness=self.allowed_lateness,
            dim=1, epsilon=self.epsilon,
            clip_bound=1.0, delta=self.delta, noise=self.noise, calibration=self.calibration, horizon=self.horizon,
            unbounded=self.unbounded, counter=self.counter, blt_error=self.blt_error, budget=self.budget,
            stream_groups=self.stream_groups,
        )

    def build_mechanism(self):
        return self.as_sum_params().build_mechanism()


@dataclass(frozen=True)
class _UnitLevel:
    """The unit-level form of a sum's params (``with_privacy_unit``; ``beam_dp.mechanisms.sums.unit_level``):
    the mechanism is calibrated on ``R·F`` (``F``: the unit factor of the event-level mechanism under the
    unit's bounds) while contributions stay clipped to ``R``. A separate class, so that params without a
    unit keep their fields, and so their noise binding and releases."""

    privacy_unit: PrivacyUnit | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.privacy_unit, PrivacyUnit):
            raise TypeError("unit-level params need a PrivacyUnit")
        if self.clock is None:
            raise ValueError("privacy units need event-time steps (a clock), not block_size")
        if self.restore_states:
            raise ValueError("privacy units do not resume from saved states: the units' ledger is not saved, so a "
                             "resumed run could let a unit take part again")
        if self.noise == "discrete_laplace":
            raise ValueError("privacy units scale the noise by a real factor: use noise='gamma' for pure epsilon")
        object.__setattr__(self, "_unit_factor", UnitFactor(1.0, 1.0, True, 1))
        try:
            factor = unit_factor(super().build_mechanism(), self.unit_bounds())  # type: ignore[misc]
        except ValueError as exc:
            raise ValueError(f"privacy unit: {exc}") from None
        object.__setattr__(self, "_unit_factor", factor)
        super().__post_init__()  # type: ignore[misc]

    @property
    def unit_factor(self) -> UnitFactor:
        """``F`` and the unit's loss over one event's at event-level noise (``unit_level.unit_factor``)."""
        return self._unit_factor

    def unit_bounds(self):
        """The ledger's :class:`~beam_dp.core.units.UnitBounds` (the window rule for a windowed sum)."""
        return self.privacy_unit.bounds(getattr(self, "window", None))

    def unit_declaration(self) -> dict[str, Any]:
        """The meta fields every release declares: the unit, its bounds and ``R`` (``clip_bound``)."""
        return {**self.privacy_unit.declaration(), "clip_bound": float(self.clip_bound)}

    def sum_spec(self, clip_bound: float | None = None) -> SumSpec:
        spec = super().sum_spec(clip_bound)  # type: ignore[misc]
        return dataclasses.replace(spec, clip_bound=spec.clip_bound * self._unit_factor.factor)


@dataclass(frozen=True)
class _UnitSumParams(_UnitLevel, ContinualSumParams):
    """``ContinualSumParams`` at the unit level."""


@dataclass(frozen=True)
class _UnitLevelCountSumParams(_UnitLevel, _UnitCountSumParams):
    """A count's sum params at the unit level."""


@dataclass(frozen=True)
class _UnitWindowedSumParams(_UnitLevel, WindowedSumParams):
    """``WindowedSumParams`` at the unit level (the window rule)."""


_UNIT_LEVEL: dict[type, type] = {ContinualSumParams: _UnitSumParams, _UnitCountSumParams: _UnitLevelCountSumParams,
                                 WindowedSumParams: _UnitWindowedSumParams}


beam.coders.registry.register_coder(ReleaseRow, beam.coders.RowCoder)


def _by_stream(keyed_block):
    (stream, step), block = keyed_block
    return stream, (step, block, None)


class _ContinualRelease(beam.PTransform):
    """Shared expansion of the continual transforms (see the module docstring)."""

    def __init__(self, params: Any, pre_aggregate: bool | None = None, label: str | None = None):
        super().__init__(label)
        self.params = params
        self.pre_aggregate = pre_aggregate

    def expand(self, events: PCollection) -> ContinualOutputs:
        params = bind_noise_domain(self.params, events)
        bounded = bool(getattr(events, "is_bounded", True))
        if params.event_time and bounded and params.clock.last_step is None:
            raise ValueError("a batch replay with event-time steps needs a public end: StepClock(..., end=...)")
        unit = getattr(params, "privacy_unit", None)
        aggregate = params.event_time and (bounded if self.pre_aggregate is None else self.pre_aggregate)
        groups = getattr(params, "stream_groups", None)
        block_type = ClippedSum if groups is None else GroupBlock
        unit_dead: list[PCollection] = []  # the streaming unit stage's late letters
        # typed keys get deterministic coders; typed blocks the block coder (beam_dp.io.coders)
        if unit is None:
            parsed = events | "Parse" >> beam.ParDo(ParseEvents(params, aggregate)).with_output_types(
                Tuple[Tuple[str, int], block_type] if aggregate else Tuple[str, Any]).with_outputs(
                DEAD_LETTER, main="blocks")
            blocks = parsed.blocks
        else:  # keyed by unit hash, each unit bounded over its steps (beam_dp.beam.shell.units, units_streaming)
            parsed = events | "UnitEvents" >> beam.ParDo(UnitEvents(params, UNIT_BUCKETS if bounded else None)).with_output_types(
                Tuple[int, Any]).with_outputs(DEAD_LETTER, main="events")
            if bounded:
                aggregate = True
                blocks = (parsed.events | "ByUnit" >> beam.GroupByKey()
                          | "BoundUnits" >> beam.ParDo(BoundUnits(params)).with_output_types(
                              Tuple[Tuple[str, int], block_type]))
            elif groups is not None:
                raise ValueError("privacy units on a stream release keyed by stream: leave stream_groups unset")
            else:  # each unit's kept sums leave at their step's close; the release shell sums them per step
                blocks, late = parsed.events | "UnitSteps" >> BoundUnitStream(params)
                blocks = blocks | "ByStream" >> beam.Map(_by_stream).with_output_types(
                    Tuple[str, Tuple[int, ClippedSum, Any]])
                unit_dead.append(late)
        if aggregate:
            # keyed by stream: a lifted combiner; keyed by groups: Parse summed each bundle already
            # (BundleGroupSums), and the release stage adds a group's blocks of one step as they come
            # (batch_release: one shuffle, not one per (group, step) and one per group)
            if groups is None:
                blocks = blocks | "PreAggregate" >> beam.CombinePerKey(MergeClippedSums()).with_output_types(
                    Tuple[Tuple[str, int], block_type])
            blocks = blocks | "ByStream" >> beam.Map(_by_stream).with_output_types(
                Tuple[str, Tuple[int, block_type, Any]])
        restored = [stream for stream, _ in (getattr(params, "restore_states", None) or ())]
        declared_streams = sorted(set(params.streams or ()) | set(restored))
        if declared_streams:  # declared and restored streams release every step, data or not
            declared = events.pipeline | "DeclareStreams" >> beam.Create(
                _declarations(declared_streams, groups, params.dim)).with_output_types(Tuple[str, Any])
            blocks = (blocks, declared) | "WithDeclared" >> beam.Flatten()
        # the group count is in the stateful step's label: Dataflow refuses an --update that drops a
        # step (a changed count) unless mapped; a mapped one meets the count recorded in each key's state
        release = "Release" if groups is None else f"Release {groups} stream groups"
        # a batch replay: a GroupByKey and each key released in one call (every shuffled element stays one
        # (key, step) block); a stream: the stateful shell
        released = release_stage(blocks, params, release, bounded,
                                 rows_type=None if groups is None else ReleaseColumns)
        labels = release_labels(params)
        if unit is not None:  # every row's meta declares the unit and its bounds (public parameters)
            labels = dataclasses.replace(labels, unit_meta=tuple(sorted(params.unit_declaration().items())))
        if groups is None:
            rows = released.rows | "Rows" >> beam.Map(labels).with_output_types(ReleaseRow)
        else:
            rows = released.rows | "Labels" >> beam.Map(lambda columns: columns._replace(labels=labels)).with_output_types(
                ReleaseColumns)
        dead = (parsed[DEAD_LETTER], *unit_dead, released[DEAD_LETTER]) | "DeadLetters" >> beam.Flatten()
        return ContinualOutputs(rows, dead)


def _declarations(streams: list[str], groups: int | None, dim: int) -> list[tuple[str, Any]]:
    """The elements that declare ``streams``: one per stream, or one ``GroupBlock`` per group."""
    if groups is None:
        return [(s, (0, None, None)) for s in streams]
    by_group: dict[int, list[str]] = {}
    for stream in streams:
        by_group.setdefault(group_of(stream, groups), []).append(stream)
    return [(group_key(g), (0, GroupBlock.declaring(names, dim), None)) for g, names in sorted(by_group.items())]


class ContinualSum(_ContinualRelease):
    """Private running sum of vector contributions per stream, released at every step.

    Guarantee: each contribution (event level, replace-one) is epsilon-DP (Gamma/K-norm noise) or
    (epsilon, delta)-DP (Gaussian) over the whole, unbounded release sequence. Contributions are
    clipped to L2 norm ``clip_bound``. Public: the step schedule, the stream set, release times.

    Args:
        params: a :class:`ContinualSumParams` (every privacy parameter, checked at its construction).
        pre_aggregate: sum contributions per (stream, step) before the stateful step (event time only);
            default None: on a bounded input (batch replay) only. Releases do not depend on it.
        label: the transform's label (default None: Beam's); it names the noise domain when
            ``params.noise_key.domain`` is unset.
        privacy_unit: protect one privacy unit's whole bounded contribution instead of one event
            (:class:`PrivacyUnit`; event time, batch replay or stream; the noise is calibrated at the unit
            level, ``docs/privacy_units.md``). Default None: event level.
    """

    def __init__(self, params: ContinualSumParams, pre_aggregate: bool | None = None, label: str | None = None,
                 privacy_unit: PrivacyUnit | None = None):
        if not isinstance(params, ContinualSumParams):
            raise TypeError("ContinualSum takes a ContinualSumParams")
        super().__init__(params if privacy_unit is None else params.with_privacy_unit(privacy_unit), pre_aggregate,
                         label)


class WindowedSum(_ContinualRelease):
    """Private running sum with privacy expiration (window tree): each contribution is protected
    while fewer than ``window`` (rounded up to a power of two) later steps have been released;
    afterwards it appears un-noised in later releases (window DP).

    Args:
        params: a :class:`WindowedSumParams` (every privacy parameter, checked at its construction).
        pre_aggregate, label, privacy_unit: as ``ContinualSum``.
    """

    def __init__(self, params: WindowedSumParams, pre_aggregate: bool | None = None, label: str | None = None,
                 privacy_unit: PrivacyUnit | None = None):
        if not isinstance(params, WindowedSumParams):
            raise TypeError("WindowedSum takes a WindowedSumParams")
        super().__init__(params if privacy_unit is None else params.with_privacy_unit(privacy_unit), pre_aggregate,
                         label)


def _as_unit_event(element: Any, event_time: bool, unit: str | None = None) -> Any:
    """Replace an event's value by 1.0 (keeping its privacy unit field ``unit``, when given: the 4th item
    of a tuple ``(stream_id, timestamp, anything, unit_id)``); leave anything unrecognisable for Parse to
    dead-letter."""
    if isinstance(element, UnitEventBatch):
        return element.counted()
    if isinstance(element, EventBatch):
        return EventBatch(element.stream_ids, element.timestamps, np.ones((len(element), 1)))
    if unit is not None and isinstance(element, tuple) and not hasattr(element, "_fields") and len(element) == 4:
        return (element[0], element[1], 1.0, element[3])
    if isinstance(element, tuple) and not hasattr(element, "_fields") and len(element) in (2, 3):
        if len(element) == 3 or event_time:
            return (element[0], element[1], 1.0)
        return (element[0], 1.0)
    kept = {} if unit is None else {unit: _field(element, unit)}
    if isinstance(element, dict) and "stream_id" in element:
        return {"stream_id": element["stream_id"], "timestamp": element.get("timestamp"), "value": 1.0, **kept}
    if hasattr(element, "stream_id"):
        return {"stream_id": element.stream_id, "timestamp": getattr(element, "timestamp", None), "value": 1.0,
                **kept}
    return element


def _field(element: Any, name: str) -> Any:
    return element.get(name) if isinstance(element, dict) else getattr(element, name, None)


class ContinualCount(beam.PTransform):
    """Private running count of events per stream (a ``ContinualSum`` of 1 per event).

    Elements: ``(stream_id, timestamp)``, ``(stream_id, timestamp, anything)``, mappings/rows with
    ``stream_id`` and ``timestamp``, or ``EventBatch``. Same guarantee as ``ContinualSum`` with
    sensitivity 2 (replace-one).

    Args:
        params: a :class:`ContinualCountParams` (every privacy parameter, checked at its construction).
        pre_aggregate, label, privacy_unit: as ``ContinualSum``.
    """

    def __init__(self, params: ContinualCountParams, pre_aggregate: bool | None = None, label: str | None = None,
                 privacy_unit: PrivacyUnit | None = None):
        super().__init__(label)
        if not isinstance(params, ContinualCountParams):
            raise TypeError("ContinualCount takes a ContinualCountParams")
        self.params = params
        self.pre_aggregate = pre_aggregate
        self.privacy_unit = privacy_unit
        self._sum_params()  # refused here, not when applied

    def _sum_params(self) -> ContinualSumParams:
        sums = self.params.as_sum_params()
        return sums if self.privacy_unit is None else sums.with_privacy_unit(self.privacy_unit)

    def expand(self, events: PCollection) -> ContinualOutputs:
        unit = None if self.privacy_unit is None else self.privacy_unit.column
        units = events | "AsUnit" >> beam.Map(_as_unit_event, self.params.event_time, unit)
        return units | "Sum" >> _ContinualRelease(self._sum_params(), self.pre_aggregate)
