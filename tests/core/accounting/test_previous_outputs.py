"""Outputs of the previous release stay readable (fixtures: tests/fixtures/previous_release, written by its
``make_fixtures.py`` with that release's code): every state it encoded decodes with today's classes (a class
whose module moved is found through ``core.state.FORMER_MODULES``), every buffered entry and key state
decodes, and every job folder it wrote verifies with today's verifier, the folders together declaring every
account kind of ``ACCOUNT_KINDS``. A move that breaks an old output fails here."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from beam_dp.core.noise_declaration import ACCOUNT_KINDS, declared_terms, loss_of_declaration
from beam_dp.core.state import FORMER_MODULES, decode_fields, decode_state
from beam_dp.steps.coder import KINDS, decode_entry, decode_key_state, kind_class

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "previous_release"
STATES = sorted((FIXTURES / "states").glob("*.bin"))
ENTRIES = sorted((FIXTURES / "states" / "coder").glob("entry_*.bin"))
JOBS = sorted(p for p in (FIXTURES / "jobs").iterdir() if p.is_dir())

#: every state class the previous release encoded, where it lives today
STATE_CLASSES = {
    "beam_dp.mechanisms.erm.continual.ContinualReleaseState",
    "beam_dp.mechanisms.erm.multires.MultiResolutionState",
    "beam_dp.mechanisms.erm.sliding.SlidingWindowState",
    "beam_dp.mechanisms.growing_db.pmwg.PMWGState",
    "beam_dp.mechanisms.growing_db.schedulers.SchedulerState",
    "beam_dp.mechanisms.lifelong.learner.LifelongState",
    "beam_dp.mechanisms.online.learners._OnlineWire",
    "beam_dp.mechanisms.online.regression.ERMState",
    "beam_dp.mechanisms.online.regression.RegState",
    "beam_dp.mechanisms.online.regression_torch._Wire",
    "beam_dp.mechanisms.stream_groups.StreamGroupsState",
    "beam_dp.mechanisms.sums.blt.BLTState",
    "beam_dp.mechanisms.sums.honaker.HonakerTreeState",
    "beam_dp.mechanisms.sums.snapping._SnappedWire",
    "beam_dp.mechanisms.sums.toeplitz.ToeplitzSqrtState",
    "beam_dp.mechanisms.sums.tree.BinaryTreeState",
    "beam_dp.mechanisms.sums.tree.DoublingTreeState",
    "beam_dp.mechanisms.sums.tree.HybridTreeState",
    "beam_dp.mechanisms.sums.window_tree.WindowTreeState",
}


def _today(class_name: str) -> type:
    """The class an encoding names, looked up where it lives today."""
    module, _, name = class_name.rpartition(".")
    module = FORMER_MODULES.get(module, module)
    if module.startswith("beam_dp.mechanisms.online.regression_torch") or module.endswith("lifelong.learner"):
        pytest.importorskip("torch")
    return getattr(importlib.import_module(module), name)


def _decoded(data: bytes, seen: set[str]) -> object:
    """``data`` decoded by today's class, and every state nested in it (a uint8 array of an encoding)."""
    class_name, _, _ = decode_fields(data)
    cls = _today(class_name)
    state = decode_state(cls, data)
    seen.add(f"{cls.__module__}.{cls.__qualname__}")
    for field in dataclasses.fields(state):
        value = getattr(state, field.name)
        if isinstance(value, np.ndarray) and value.dtype == np.uint8 and value[:4].tobytes() == b"BDPS":
            _decoded(value.tobytes(), seen)
    return state


def test_the_fixtures_are_there_and_small():
    assert len(STATES) >= 20 and len(ENTRIES) == len(KINDS) + 1 and len(JOBS) >= 8
    assert sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file()) < 1 << 20


def test_every_state_of_the_previous_release_decodes_with_todays_classes():
    seen: set[str] = set()
    for path in STATES:
        state = _decoded(path.read_bytes(), seen)
        assert getattr(state, "stream", "s") == "s", path.name  # every fixture state is of stream "s"
    assert seen == STATE_CLASSES


def test_every_buffered_entry_and_the_key_state_decode():
    kinds = set()
    for path in ENTRIES:
        kind = path.stem.removeprefix("entry_")
        step, item = decode_entry(path.read_bytes())
        assert step == 4
        assert type(item) is (tuple if kind == "tuple" else kind_class(kind)), kind
        kinds.add(kind)
    assert kinds == set(KINDS) | {"tuple"}
    state = decode_key_state((FIXTURES / "states" / "coder" / "key_state.bin").read_bytes())
    assert (state.key, state.next_step, state.buffered, state.watermark, state.lowest) == ("s", 6, 1, 50_000_000, 6)
    assert (state.stream_groups, state.first_rung, state.noise_binding) == (0, 6, "b" * 16)
    assert decode_fields(state.mechanism.tobytes())[0].endswith(".HybridTreeState")


def _declarations(folder: Path) -> list[str]:
    return [text for path in sorted(folder.glob("*.parquet"))
            for text in pq.read_table(path, columns=["noise"]).column(0).to_pylist()]


@pytest.mark.parametrize("folder", JOBS, ids=lambda p: p.name)
def test_every_job_folder_of_the_previous_release_verifies(folder, capsys):
    from beam_dp.verify import main

    declarations = _declarations(folder)
    assert declarations and all(declarations)  # every release declares its noise
    for text in declarations:
        loss_of_declaration(text)  # recomputes with today's account functions (ValueError if it cannot)
    assert main([str(folder), "--strict"]) == 0, capsys.readouterr().out[-3000:]
    assert capsys.readouterr().out.strip().endswith("verified: within the job's total")


def test_the_job_folders_declare_every_account_kind():
    kinds = {kind for folder in JOBS for text in _declarations(folder) for kind, _ in declared_terms(text)[1]}
    assert kinds == set(ACCOUNT_KINDS)

