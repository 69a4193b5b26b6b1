"""Faults and replay (issue 8, item 3).

* A release stage that raises once, after processing (and, for the stateful shell, writing state for)
  the k-th element — the stateful shell, and the key shell a batch replay uses (docs/steps.md): the
  BundleBasedDirectRunner retries the bundle and the releases are byte-identical to a failure-free
  run (state of the failed attempt is discarded, every noise draw is a pure function of (key,
  stream, purpose, node)). The FnApiRunner does not retry (the pipeline fails); re-running it —
  what a production runner does from its last committed state, here the empty start of a batch
  replay — gives byte-identical releases too.
* Snapshot/restore: every mechanism family's state is encoded mid-stream (``encode_state``),
  decoded into a FRESH mechanism instance and continued; the releases equal an uninterrupted run.
* A replay under a different key changes the noise (same schedule, different values), and the
  README warns that replaying different data under the same key leaks the difference.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest

import beam_dp.beam.shell.batch_release as batch_release_module
import beam_dp.beam.sums as transforms_module
from beam_dp.beam import ContinualSum, ContinualSumParams
from beam_dp.beam.shell.batch_release import KeyReleaseDoFn
from beam_dp.beam.shell.dofn import ContinualReleaseDoFn
from beam_dp.core import NoiseSource, StepClock
from beam_dp.mechanisms.erm import (
    ContinualReleaseMechanism,
    HuberRegression,
    LabelledRows,
    MultiResolutionMechanism,
    SlidingWindowMechanism,
)
from beam_dp.mechanisms.growing_db.base import GrowingBlock, Query
from beam_dp.mechanisms.growing_db.pmwg import PMWG
from beam_dp.mechanisms.growing_db.schedulers import BBScheduler, LaplaceHistogram
from beam_dp.mechanisms.lifelong.factory import build_learner
from beam_dp.mechanisms.online.learners import make_online_learner
from beam_dp.mechanisms.online.regression import make_incremental_regression
from beam_dp.mechanisms.sums import make_counter
from beam_dp.mechanisms.sums.tree import DoublingTreeSum, HybridTreeSum
from beam_dp.mechanisms.sums.window_tree import WindowTreeSum
from beam_dp.steps.events import DEAD_LETTER
from tests.conftest import TEST_KEY
from tests.reliability.harness import run_pipeline, sorted_releases
from tests.reliability.targets import _sum_events

ROOT = Path(__file__).resolve().parents[2]
CLOCK = StepClock(start=0, period=10, end=50)


class FlakyReleaseDoFn(ContinualReleaseDoFn):
    """Raises once, after processing the k-th element (``marker`` file: 'once' across pickled copies)."""

    def __init__(self, params, per_step_timers, marker: str, k: int = 3):
        super().__init__(params, per_step_timers)
        self._marker, self._k, self._seen = marker, k, 0

    def process(self, element, key_state=beam.DoFn.StateParam(ContinualReleaseDoFn.KEY_STATE),
                buffer=beam.DoFn.StateParam(ContinualReleaseDoFn.BUFFER),
                close=beam.DoFn.TimerParam(ContinualReleaseDoFn.CLOSE),
                end=beam.DoFn.TimerParam(ContinualReleaseDoFn.END)):
        self._seen += 1
        # the element is fully processed (its state writes done) before the fault: a retry must discard them
        outputs = list(super().process(element, key_state, buffer, close, end))
        marker = Path(self._marker)
        if self._seen == self._k and not marker.exists():
            marker.write_text("failed once")
            raise RuntimeError("injected fault")
        yield from outputs


class FlakyKeyReleaseDoFn(KeyReleaseDoFn):
    """The key shell, raising once after releasing its k-th key (``marker`` file: 'once' across copies)."""

    def __init__(self, params, marker: str, k: int = 2):
        super().__init__(params)
        self._marker, self._k, self._seen = marker, k, 0

    def process(self, element):
        self._seen += 1
        outputs = list(super().process(element))
        marker = Path(self._marker)
        if self._seen == self._k and not marker.exists():
            marker.write_text("failed once")
            raise RuntimeError("injected fault")
        yield from outputs


def _inject(monkeypatch, shell: str, marker: Path) -> None:
    """Make the batch replay's release stage fail once: the stateful shell (forced in place of the key
    shell) or the key shell itself."""
    if shell == "key":
        monkeypatch.setattr(batch_release_module, "KeyReleaseDoFn",
                            lambda params: FlakyKeyReleaseDoFn(params, str(marker)))
        return

    def stateful_stage(items, params, label, bounded, per_step_timers=None, rows_type=None):
        return items | label >> beam.ParDo(FlakyReleaseDoFn(params, False, str(marker))).with_outputs(
            DEAD_LETTER, main="rows")
    monkeypatch.setattr(transforms_module, "release_stage", stateful_stage)


def _sum_pipeline(params, events):
    def build(p):
        out = p | beam.Create(events, reshuffle=False) | ContinualSum(params, pre_aggregate=False)
        return {"releases": out.releases, "dead": out.dead_letter}
    return build


@pytest.mark.parametrize("shell", ["stateful", "key"])
def test_injected_fault_then_rerun_is_byte_identical(shell, tmp_path, monkeypatch):
    params = ContinualSumParams(clock=CLOCK, streams=("a", "b"), dim=2, epsilon=1.0, clip_bound=1.0)
    events = _sum_events(0)
    clean = sorted_releases(run_pipeline(_sum_pipeline(params, events)).releases)
    marker = tmp_path / "fault"
    _inject(monkeypatch, shell, marker)
    retried = False
    try:
        flaky = run_pipeline(_sum_pipeline(params, events))
    except Exception as exc:  # the FnApiRunner fails the job; a runner restarts from committed state
        assert "injected fault" in repr(exc) or "injected fault" in str(exc.__cause__)
        retried = True
        flaky = run_pipeline(_sum_pipeline(params, events))
    assert marker.exists(), "the fault was never injected"
    assert retried, "the FnApiRunner retried the bundle itself (update docs/reliability.md)"
    assert pickle.dumps(sorted_releases(flaky.releases)) == pickle.dumps(clean)


@pytest.mark.parametrize("shell", ["stateful", "key"])
def test_injected_fault_is_retried_by_the_bundle_runner_with_byte_identical_releases(shell, tmp_path, monkeypatch):
    """The BundleBasedDirectRunner retries a failed bundle (up to 4 attempts) and commits state only
    for a successful attempt: the fault must leave no trace in state or releases."""
    from apache_beam.options.pipeline_options import PipelineOptions

    params = ContinualSumParams(clock=CLOCK, streams=("a", "b"), dim=2, epsilon=1.0, clip_bound=1.0)
    events = _sum_events(0)
    options = PipelineOptions(runner="BundleBasedDirectRunner")
    clean = sorted_releases(run_pipeline(_sum_pipeline(params, events), options).releases)
    marker = tmp_path / "fault"
    _inject(monkeypatch, shell, marker)
    retried = run_pipeline(_sum_pipeline(params, events), options)
    assert marker.exists(), "the fault was never injected"
    assert clean and pickle.dumps(sorted_releases(retried.releases)) == pickle.dumps(clean)
    assert any("injected fault" in line for line in retried.logs), "the runner did not log the failed attempt"


# -- snapshot / restore of every mechanism family -------------------------------------------------
def _rng_rows(n, d, seed):
    return np.random.default_rng(seed).uniform(-1, 1, (n, d)) / np.sqrt(d)


def _erm_blocks(n_blocks, size):
    rng = np.random.default_rng(0)
    return [LabelledRows(rng.uniform(-1, 1, (size, 2)) / 2, rng.uniform(-1, 1, size)) for _ in range(n_blocks)]


HUBER = HuberRegression(n_features=2, clip_bound=1.0, huber=1.0)
CASES = {
    "tree/hybrid": (lambda: HybridTreeSum(dim=2, epsilon=1.0, clip_bound=1.0), None),
    "tree/doubling": (lambda: DoublingTreeSum(dim=2, epsilon=1.0, clip_bound=1.0), None),
    "window tree": (lambda: WindowTreeSum(dim=2, epsilon=1.0, clip_bound=1.0, window=4), None),
    **{f"counter/{c}": (lambda c=c, noise=noise: make_counter(c, horizon=16, noise=noise, dim=2, epsilon=1.0,
                                                              delta=1e-6 if noise == "gaussian" else 0.0,
                                                              clip_bound=1.0), None)
       for c, noise in (("blt", "gaussian"), ("toeplitz", "gaussian"), ("honaker", "gamma"), ("kary", "gamma"))},
    "erm/multires": (lambda: MultiResolutionMechanism(block=4, model=HUBER, lam=1.0, epsilon=1.0),
                     lambda: _erm_blocks(8, 4)),
    "erm/continual": (lambda: ContinualReleaseMechanism(update=2, base=4, model=HUBER, lam=1.0, epsilon=1.0),
                      lambda: _erm_blocks(10, 2)),
    "erm/sliding": (lambda: SlidingWindowMechanism(block=2, levels=2, model=HUBER, lam=1.0, epsilon=1.0),
                    lambda: _erm_blocks(10, 2)),
    "online/cocop": (lambda: make_online_learner("cocop", dim=2, constraint="simplex", loss="logistic", epsilon=1.0,
                                                 window=4, mu=1.0),
                     lambda: [(r, 1.0 if i % 2 else -1.0) for i, r in enumerate(_rng_rows(12, 2, 1))]),
    "regression/privincreg1": (lambda: make_incremental_regression("privincreg1", dim=2, epsilon=1.0, delta=1e-6,
                                                                   horizon=16),
                               lambda: [(r, 0.5) for r in _rng_rows(12, 2, 2)]),
    "pmwg": (lambda: PMWG(universe_size=3, n=4, epsilon=1.0, alpha=0.3),
             lambda: [GrowingBlock(np.array([0, 1, 2, 1]), (Query(4, "q0", np.array([1.0, 0.0, 0.5])),))] +
             [GrowingBlock(np.array([i % 3]), (Query(5 + i, f"q{i + 1}", np.array([0.0, 1.0, 1.0])),))
              for i in range(8)]),
    "bbscheduler": (lambda: BBScheduler(LaplaceHistogram(3), universe_size=3, n=4, epsilon=1.0, gamma=0.5),
                    lambda: [GrowingBlock(np.array([0, 1, 2, 1]), (Query(4, "q0", np.array([1.0, 0.0, 0.5])),))] +
                    [GrowingBlock(np.array([i % 3]), (Query(5 + i, f"q{i + 1}", np.array([0.0, 1.0, 1.0])),))
                     for i in range(8)]),
}


def _values(releases):
    return [(r.stream, r.step, pickle.dumps(r.value), r.epsilon_spent, r.delta_spent) for r in releases]


@pytest.mark.parametrize("name", list(CASES))
def test_snapshot_restore_into_a_fresh_mechanism_equals_uninterrupted(name):
    make, blocks = CASES[name]
    blocks = blocks() if blocks else [_rng_rows(3, 2, t) for t in range(12)]
    noise = NoiseSource(TEST_KEY)
    mech = make()
    state, whole = mech.init_state("s"), []
    for block in blocks:
        state, rel = mech.step(state, block, noise)
        whole += rel
    cut = len(blocks) // 2
    first = make()
    state, part = first.init_state("s"), []
    for block in blocks[:cut]:
        state, rel = first.step(state, block, noise)
        part += rel
    snapshot = first.encode_state(state)
    del first, state
    fresh = make()  # a new process/pipeline would rebuild the mechanism from params the same way
    state = fresh.decode_state(snapshot)
    for block in blocks[cut:]:
        state, rel = fresh.step(state, block, NoiseSource(TEST_KEY))
        part += rel
    assert whole and _values(part) == _values(whole)


def test_lifelong_snapshot_restore():
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from beam_dp.mechanisms.lifelong import L2DPConfig, TaskData

    config = L2DPConfig(input_dim=4, n_classes=2, hidden=4, g_layers=(4,), batch_size=4, epochs=1,
                        task_ids=("t0", "t1"), eval_sets=None, device="cpu", epsilon=1.0)
    rng = np.random.default_rng(0)
    tasks = [TaskData(t, rng.uniform(-1, 1, (8, 4)), rng.integers(0, 2, 8)) for t in ("t0", "t1")]
    noise = NoiseSource(TEST_KEY)
    learner = build_learner(config)
    state, whole = learner.init_state("s"), []
    for task in tasks:
        state, rel = learner.step(state, learner.merge_blocks([task]), noise)
        whole += rel
    first = build_learner(config)
    state, first_rel = first.step(first.init_state("s"), first.merge_blocks([tasks[0]]), noise)
    fresh = build_learner(config)
    state, second_rel = fresh.step(fresh.decode_state(first.encode_state(state)), fresh.merge_blocks([tasks[1]]), noise)
    assert _values(first_rel + second_rel) == _values(whole)


# -- keys -------------------------------------------------------------------------------------------
def test_replay_under_a_different_key_changes_the_noise_not_the_schedule(monkeypatch):
    params = ContinualSumParams(clock=CLOCK, streams=("a", "b"), dim=2, epsilon=1.0, clip_bound=1.0)
    events = _sum_events(0)
    first = sorted_releases(run_pipeline(_sum_pipeline(params, events)).releases)
    again = sorted_releases(run_pipeline(_sum_pipeline(params, events)).releases)
    monkeypatch.setenv("BEAM_DP_NOISE_KEY", bytes(range(100, 132)).hex())
    other = sorted_releases(run_pipeline(_sum_pipeline(params, events)).releases)
    assert first == again  # same key: a replay reproduces the run exactly
    assert [(r.stream, r.step, r.step_start, r.step_end) for r in other] == \
           [(r.stream, r.step, r.step_start, r.step_end) for r in first]
    assert all(not np.allclose(a.value, b.value) for a, b in zip(first, other))


def test_readme_warns_that_replaying_different_data_under_the_same_key_leaks_the_difference():
    readme = (ROOT / "README.md").read_text()
    assert "run *different* data under the same key, labels and parameters" in readme
    assert "exact difference of the data" in readme
    assert "**changed parameter** under one key draws independent noise" in readme
