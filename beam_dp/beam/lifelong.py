"""``LifelongLearner``: private lifelong (continual) learning on a stream of tasks, one snapshot per task
(guide: ``docs/lifelong.md``).

Elements (per stream, tasks in the declared order ``params.learner.task_ids``):

* ``(stream_id, task_id, x, y)``: one training row (``x`` shape (d,), ``y`` an integer class id) or a
  block of rows (``x`` (n, d), ``y`` (n,)); inputs are clipped to [−1, 1] by the learner;
* ``(stream_id, task_id, END_OF_TASK)``: closes ``task_id`` (and every earlier open task) now — the
  streaming way to end a task. In a batch replay every declared task closes when the input ends.

When a task closes the learner trains on it (rows in a canonical order, so the release does not depend
on delivery order) and releases the weights as a mapping-valued ``ReleaseRow`` (one array per layer,
listed in ``parts``) with accuracy metadata computed only on the public ``eval_sets``. Every declared
task releases once, with or without data (release times are public). Raw rows wait in keyed state
until their task closes and are discarded then; only the learner's state (weights, optimiser, episodic
memory, one-time noise) is kept.

Dead letters (reason, value-free detail, element): ``malformed``, ``bad_stream_id``,
``undeclared_stream``, ``unknown_task``, ``wrong_shape``/``bad_value``/``bad_dtype``/``non_finite``
(inputs), ``bad_label`` (not an integer in [0, K)), ``task_backwards`` (a row or marker for a task that
is already closed).

Guarantees: those of the learner (``L2DPConfig``: the paper's claim, labelled ``paper_claim`` on every
release and warned about once per worker; ``BoundedAGEMConfig``/``NaiveGaussianConfig``: (ε, δ)-DP
from dp-accounting). The torch device is chosen on each worker in ``setup()``: CUDA when available and
``allow_cuda``, else the CPU. The non-private ``AGEMConfig`` is refused.

With ``privacy_unit=`` (a :class:`~beam_dp.core.group_privacy.RecordUnit`; batch replay only) every snapshot
protects one privacy unit's whole contribution of at most ``max_records`` training rows over the stream's
life, by group privacy of the learner's guarantee over the chain of its row changes (add/remove for the
DP-SGD learners, Lai et al.'s lifelong neighbours for L2DP-ML), calibrated at the record-level (ε, δ)
:func:`~beam_dp.core.group_privacy.record_budget` gives (``LifelongParams.with_privacy_unit``;
``docs/lifelong.md``, "Privacy units"). Each element is then one row carrying the unit field (a tuple's last
item, a mapping key or a row attribute); a block of rows (``wrong_shape``) or an ``END_OF_TASK`` marker
(``malformed``: every task closes at the end of the replay) is a dead letter, and a bad id a ``bad_unit_id``
one without the id.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from beam_dp.beam.shell.blocks import BundleBlocks, RecordColumns, alone, by_record
from beam_dp.beam.shell.dofn import DriverDoFn, EncodedBuffer
from beam_dp.beam.shell.domains import bind_noise_domain, release_labels
from beam_dp.beam.shell.outputs import ContinualOutputs
from beam_dp.beam.shell.unit_records import BoundUnitRecords
from beam_dp.core.budget import BudgetShare, Composition, JobBudget, check_share
from beam_dp.core.group_privacy import RecordUnit, check_unit_share
from beam_dp.core.noise_binding import calibration_binding
from beam_dp.io.keys import load_noise_source
from beam_dp.mechanisms.lifelong.config import BoundedAGEMConfig, L2DPConfig, NaiveGaussianConfig, TaskData
from beam_dp.mechanisms.lifelong.factory import build_learner
from beam_dp.steps.coder import encode_key_state
from beam_dp.steps.driver import StepDriver
from beam_dp.steps.events import DEAD_LETTER, DeadLetter, Reason, coerce_value, numeric_array, split_event, value_letter
from beam_dp.steps.params import NoiseKey, check_streams, legacy_noise_of, noise_source_of
from beam_dp.steps.policies import TaskPolicy
from beam_dp.steps.schema import ReleaseRow

__all__ = ["END_OF_TASK", "LifelongDoFn", "LifelongLearner", "LifelongParams", "ParseTaskRows"]

log = logging.getLogger(__name__)

END_OF_TASK = "__end_of_task__"
UNKNOWN_TASK = "unknown_task"
BAD_LABEL = "bad_label"
TASK_BACKWARDS = TaskPolicy.TASK_BACKWARDS
_DECLARE = -1
#: with a unit a task's END_OF_TASK marker is a dead letter (no unit's row), so a stream's tasks close only
#: when the input ends: a streaming input would never release
UNIT_TASKS_BATCH_ONLY = ("a unit-level lifelong learner runs on a batch replay only: its tasks close at the end of "
                         "the input (an END_OF_TASK marker is no unit's row)")
_warned_paper_claim = False


@dataclass(frozen=True)
class LifelongParams:
    """Parameters of :class:`LifelongLearner` (validated at construction; ``docs/lifelong.md``).

    Args:
        learner: the private learner and its guarantee: a ``BoundedAGEMConfig`` or ``NaiveGaussianConfig``
            ((ε, δ)-DP from dp-accounting) or an ``L2DPConfig`` (the paper's unaudited claim, labelled
            ``paper_claim``), with declared ``task_ids`` (the public task order).
        streams: stream ids (non-empty UTF-8 strings) that release every task even without data; default None.
        noise_key: where workers read the secret noise key, and the noise domain
            (:class:`~beam_dp.steps.params.NoiseKey`; default ``NoiseKey()``).
        budget: this transform's share of its job's budget (``**share.params()``; default None): refused
            unless the learner's (ε, δ) fits it under basic composition; not for an ``L2DPConfig``.
        allow_cuda: let workers train on CUDA when present (default True); False: the CPU.
        torch_threads: torch intra-op threads per worker (integer >= 1; default None: torch's own). Not part
            of the calibration.
        privacy_unit: the :class:`~beam_dp.core.group_privacy.RecordUnit` every snapshot protects (default None:
            one training row); set by :meth:`with_privacy_unit`, with the learner at the record-level budget
            and ``budget`` the unit's share.
    """

    learner: L2DPConfig | BoundedAGEMConfig | NaiveGaussianConfig
    streams: tuple[str, ...] | None = None
    noise_key: NoiseKey = field(default_factory=NoiseKey)
    budget: BudgetShare | None = None  # this transform's share of its job's budget (**share.params())
    allow_cuda: bool = True
    torch_threads: int | None = None
    privacy_unit: RecordUnit | None = None  # the unit protected (with_privacy_unit); None: one training row

    def __post_init__(self) -> None:
        if not isinstance(self.learner, (L2DPConfig, BoundedAGEMConfig, NaiveGaussianConfig)):
            raise ValueError("learner must be an L2DPConfig, BoundedAGEMConfig or NaiveGaussianConfig")
        if self.learner.task_ids is None:
            raise ValueError("the learner must declare task_ids (the public task order)")
        check_streams(self)
        if self.torch_threads is not None and (not isinstance(self.torch_threads, int) or self.torch_threads < 1):
            raise ValueError("torch_threads must be an integer >= 1 or None")
        check_unit_share(self.privacy_unit, self.budget)
        if self.budget is not None:
            own_unit_share = self.privacy_unit is not None and len(self.budget.plan.shares) == 1
            if isinstance(self.learner, L2DPConfig) and not own_unit_share:
                raise ValueError("L2DP-ML's guarantee is the paper's unaudited claim: it cannot take a share of a "
                                 "job budget; use BoundedAGEMConfig (DP-SGD + A-GEM)")
            check_share(self.budget, self.learner.epsilon, _delta(self.learner), self.composition, "LifelongParams")

    # DP-SGD's subsampled Gaussian steps are accounted with RDP: basic (epsilon, delta) composition with others
    composition: ClassVar[Composition] = "approx"

    def with_privacy_unit(self, unit: RecordUnit) -> "LifelongParams":
        """These params protecting one privacy unit of at most ``unit.max_records`` training rows as they
        protect one row: their budget share (one for the transform alone if they have none) becomes the
        unit's (:meth:`~beam_dp.core.budget.BudgetShare.per_unit`, ``approx`` composition: the learners'
        (ε, δ) guarantees, L2DP-ML's with δ = 0, so ``kε`` exactly) and the learner config is calibrated at
        its record-level ``(epsilon, delta)``, so every calibration (DP-SGD's noise multipliers and memory
        share, L2DP-ML's Laplace scales) sees it. A fixed ``noise_multiplier`` is refused: it is not
        calibrated to any budget."""
        if not isinstance(unit, RecordUnit):
            raise TypeError(f"privacy_unit must be a RecordUnit, got {type(unit).__name__}")
        if self.privacy_unit is not None:
            raise ValueError("these params protect a privacy unit already")
        if getattr(self.learner, "noise_multiplier", None) is not None:
            raise ValueError("a fixed noise_multiplier is not calibrated to a privacy unit's budget: leave it unset")
        epsilon, delta = self.learner.epsilon, _delta(self.learner)
        share = self.budget or JobBudget(epsilon, delta).plan({"transform": (self.composition, epsilon, delta)})[
            "transform"]
        share = share.per_unit(unit.max_records)
        epsilon, delta = share.record_budget()
        calibration: dict[str, Any] = {"epsilon": epsilon, **({"delta": delta} if hasattr(self.learner, "delta")
                                                              else {})}
        return dataclasses.replace(self, learner=dataclasses.replace(self.learner, **calibration), budget=share,
                                   privacy_unit=unit)

    def build_mechanism(self):
        """The learner, on CUDA when available and allowed (call on the worker)."""
        config = self.learner if self.allow_cuda else dataclasses.replace(self.learner, device="cpu")
        return build_learner(config)


def _delta(learner: Any) -> float:
    """The learner's delta (L2DP-ML's claim is pure: 0)."""
    return float(getattr(learner, "delta", 0.0))


def _dead(reason: str, detail: str, stream, element, source=None) -> beam.pvalue.TaggedOutput:
    return beam.pvalue.TaggedOutput(DEAD_LETTER, DeadLetter(reason, detail, stream, element, source))


class ParseTaskRows(beam.DoFn):
    """Validate rows and markers; emit ``(stream, (task_index, x (k, d) | None, y (k,) | None, original))``.

    A bundle's valid rows of one (stream, task) leave as one block (:class:`~beam_dp.beam.shell.blocks.BundleBlocks`,
    at most :attr:`MAX_ROWS` elements, ``original`` their :class:`~beam_dp.beam.shell.blocks.BlockOriginals`), so
    the keyed stage buffers one entry per block, not per row; a marker leaves after its stream's open blocks.
    The learner trains on a task's rows in a canonical order, so the blocks do not change a release.
    Rows read from a file come as :class:`~beam_dp.beam.shell.blocks.RecordColumns`: each row is checked
    as one element, and its letters, here or in the keyed stage, name its ``file#record=n``."""

    MAX_ROWS = 1024  # elements per block (a row of MNIST is 784 floats: a full block is ~6 MB)

    def __init__(self, params: LifelongParams):
        self._params = params

    def setup(self) -> None:
        cfg = self._params.learner
        self._dim, self._classes = cfg.input_dim, cfg.n_classes
        self._tasks = {t: i for i, t in enumerate(cfg.task_ids or ())}  # declared: LifelongParams checks
        self._one_row = self._params.privacy_unit is not None  # a unit's bound counts elements: one row each
        self._streams = frozenset(self._params.streams) if self._params.streams is not None else None
        self._dead = Metrics.counter("beam_dp/lifelong", "dead_letters")
        self._rows = Metrics.counter("beam_dp/lifelong", "elements")  # accepted rows: the jobs sum "elements"

    def start_bundle(self) -> None:
        self._blocks = BundleBlocks(_task_rows, self.MAX_ROWS)

    def finish_bundle(self) -> Iterator:
        yield from self._blocks.flush()

    def _reject(self, reason, detail, stream, element, source=None):
        self._dead.inc()
        return _dead(reason, detail, stream, element, source)

    def process(self, element: Any, timestamp=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam) -> Iterator:
        if isinstance(element, RecordColumns):
            yield from by_record(element, lambda row, original: self._one(row, timestamp, window, original))
            return
        yield from self._one(element, timestamp, window, element)

    def _one(self, element: Any, timestamp: Any, window: Any, original: Any) -> Iterator:
        """One row or marker; ``original``: what stands for it downstream (a one-row block knowing its source)."""
        marker = isinstance(element, tuple) and len(element) == 3  # (stream_id, task_id, END_OF_TASK)
        head = split_event(element, ("task_id", "marker") if marker else ("task_id", "x", "y"), None, self._streams)
        if isinstance(head, DeadLetter):
            yield self._reject(*head)
            return
        stream, _, _, (task, *payload) = head
        index = self._tasks.get(str(task)) if isinstance(task, (str, int, np.integer)) else None
        if index is None:
            yield self._reject(UNKNOWN_TASK, "task id is not among the declared task_ids", stream, element)
            return
        if marker:
            if self._one_row:
                yield self._reject(Reason.MALFORMED, "with a privacy unit every task closes at the end of the "
                                   "batch replay: no END_OF_TASK markers", stream, element)
            elif isinstance(payload[0], str) and payload[0] == END_OF_TASK:
                yield from self._blocks.flush(lambda key: key[0] == stream)  # the stream's rows before its marker
                yield stream, (index, None, None, alone(original))
            else:
                yield self._reject(Reason.MALFORMED, "a 3-tuple must be an END_OF_TASK marker", stream, element)
            return
        x_raw, y_raw = payload
        yield from self._rows_of(stream, index, element, original, x_raw, y_raw, timestamp, window)

    def _rows_of(self, stream: str, index: int, element, original, x_raw, y_raw, timestamp, window) -> Iterator:
        try:
            arr = numeric_array(x_raw, "x")
            if arr.ndim == 2 and (arr.shape[1] != self._dim or arr.shape[0] == 0):
                raise ValueError(f"{Reason.WRONG_SHAPE}: a block of rows must have shape (n >= 1, {self._dim})")
            if arr.ndim == 2 and arr.shape[0] > 1 and self._one_row:
                raise ValueError(f"{Reason.WRONG_SHAPE}: with a privacy unit an element is one row, x of shape "
                                 f"({self._dim},)")
            x = (np.stack([coerce_value(r, self._dim, "x") for r in arr]) if arr.ndim == 2
                 else coerce_value(arr, self._dim, "x")[None, :])
        except ValueError as exc:  # "<reason>: <detail>" (beam_dp.steps.events)
            yield self._reject(*value_letter(exc, stream, element))
            return
        try:
            y = np.asarray(y_raw).reshape(-1)
        except (ValueError, TypeError):  # ragged labels
            y = np.zeros(0, dtype=object)
        if y.shape != (x.shape[0],) or y.dtype.kind not in "iu" or (y.size and (y.min() < 0 or y.max() >= self._classes)):
            yield self._reject(BAD_LABEL, f"labels must be {x.shape[0]} integer(s) in [0, {self._classes})", stream,
                               element)
            return
        self._rows.inc(x.shape[0])
        yield from self._blocks.add((stream, index), (x, y.astype(np.int64)), original, timestamp, window)


def _task_rows(key: tuple[str, int], rows: list, originals: tuple) -> list:
    """The validated rows of one (stream, task) as one block ``x (n, d)``, ``y (n,)``, in arrival order."""
    stream, index = key
    return [(stream, (index, np.concatenate([x for x, _ in rows]), np.concatenate([y for _, y in rows]), originals))]


class LifelongDoFn(DriverDoFn):
    """Keyed by stream, a shell over the step driver with a :class:`~beam_dp.steps.policies.TaskPolicy`:
    step ``i + 1`` is task ``i``; a marker closes it (and every earlier open task), the end of the
    input closes every declared task."""

    def make_driver(self) -> StepDriver:
        global _warned_paper_claim
        from beam_dp.mechanisms.torch_device import set_threads

        set_threads(self._params.torch_threads)
        learner = self._params.build_mechanism()  # device chosen here, per worker
        if learner.guarantee_basis.startswith("paper_claim") and not _warned_paper_claim:
            _warned_paper_claim = True
            log.warning("beam_dp: L2DP-ML's epsilon is the paper's claim (Lai et al. Thm 2), not a standard DP "
                        "proof; see docs/lifelong.md. BoundedAGEMConfig gives a standard (epsilon, delta).")
        cfg = self._params.learner
        policy = TaskPolicy(learner, noise_source_of(self._params, load_noise_source), cfg.task_ids, cfg.input_dim)
        driver = StepDriver(policy, last_step=len(cfg.task_ids), binding=calibration_binding(self._params))
        driver.legacy_noise = legacy_noise_of(self._params, load_noise_source)  # keys written before the binding
        return driver

    def process(self, element, key_state=beam.DoFn.StateParam(DriverDoFn.KEY_STATE),
                buffer=beam.DoFn.StateParam(DriverDoFn.BUFFER), close=beam.DoFn.TimerParam(DriverDoFn.CLOSE),
                end=beam.DoFn.TimerParam(DriverDoFn.END)) -> Iterator:
        stream, (index, x, y, original) = element
        state = self.key_state(stream, key_state, close, end)
        if index == _DECLARE:
            return
        if x is None:  # END_OF_TASK: close the task (and every earlier open one) now
            outputs = self._driver.close_marked(state, EncodedBuffer(buffer), index + 1, original)
            key_state.write(encode_key_state(state))
            yield from self.emit(outputs)
            return
        task = TaskData(self._params.learner.task_ids[index], x, y)
        yield from self.add(state, key_state, buffer, index + 1, task, original)


class LifelongLearner(beam.PTransform):
    """Private lifelong learning per stream: one model snapshot (weights + public-test accuracy) per task.

    Returns ``ContinualOutputs(releases, dead_letter)``; see the module docstring for the elements, the
    dead-letter reasons and the guarantees.

    Args:
        params: a :class:`LifelongParams` (the learner's privacy parameters, checked at its construction).
        label: the transform's label (default None: Beam's); it names the noise domain when
            ``params.noise_key.domain`` is unset.
        privacy_unit: a :class:`~beam_dp.core.group_privacy.RecordUnit`: protect one unit's at most
            ``max_records`` training rows (batch replay; see the module docstring). Default None: one row.
    """

    def __init__(self, params: LifelongParams, label: str | None = None, privacy_unit: RecordUnit | None = None):
        super().__init__(label)
        if not isinstance(params, LifelongParams):
            raise TypeError("LifelongLearner takes a LifelongParams")
        self.params = params if privacy_unit is None else params.with_privacy_unit(privacy_unit)

    def expand(self, events):
        params = bind_noise_domain(self.params, events)
        unit_dead = []
        if params.privacy_unit is not None:  # at most max_records rows per unit, the id hashed and dropped
            if not getattr(events, "is_bounded", True):
                raise ValueError(UNIT_TASKS_BATCH_ONLY)
            events, bad_units = events | "BoundUnits" >> BoundUnitRecords(params.privacy_unit, params.noise_key)
            unit_dead.append(bad_units)
        parsed = events | "Parse" >> beam.ParDo(ParseTaskRows(params)).with_output_types(
            Tuple[str, Any]).with_outputs(DEAD_LETTER, main="rows")
        rows = parsed.rows
        if params.streams:
            declared = events.pipeline | "DeclareStreams" >> beam.Create(
                [(s, (_DECLARE, None, None, None)) for s in params.streams]).with_output_types(Tuple[str, Any])
            rows = (rows, declared) | "WithDeclared" >> beam.Flatten()
        learned = rows | "Learn" >> beam.ParDo(LifelongDoFn(params, per_step_timers=False)).with_outputs(
            DEAD_LETTER, main="rows")
        releases = learned.rows | "Rows" >> beam.Map(release_labels(params, params.composition)).with_output_types(
            ReleaseRow)
        dead = (*unit_dead, parsed[DEAD_LETTER], learned[DEAD_LETTER]) | "DeadLetters" >> beam.Flatten()
        return ContinualOutputs(releases, dead)
