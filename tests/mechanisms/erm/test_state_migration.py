"""ERM states written by the version-1 code (before noise keys were counted; fixtures made by
``fixtures/make_erm_v1_states.py`` from that code) are read by this code: the stream goes on with the
same releases and spends as a stream that never stopped, and every release after the restore declares
noise whose recomputed spend equals its ``epsilon_spent``."""

import copy
from pathlib import Path

import pytest

from beam_dp.core.noise import NoiseSource
from beam_dp.core.noise_declaration import loss_of_declaration, recomputed_epsilon
from beam_dp.core.state import decode_state
from tests.conftest import TEST_KEY
from tests.mechanisms.erm.fixtures.make_erm_v1_states import BLOCKS, CASES
from tests.mechanisms.erm.util import blocks
from tests.release_checks import assert_close_values

FIXTURES = Path(__file__).parent / "fixtures"
# the stated and recomputed spends sum the same per-block losses (restated as one key per block) by
# different float arithmetic: ~1e-15 apart; 1e-9 is far below any real under-report
REL = 1e-9


def spec_calibrated(mechanism):
    """The fixture's mechanism at ``calibration="spec"``, the calibration its v1 states were written at."""
    mechanism = copy.copy(mechanism)
    mechanism.calibration = "spec"
    return mechanism


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_version_1_state_goes_on_as_if_it_never_stopped(name):
    mechanism, size = CASES[name]
    mechanism = spec_calibrated(mechanism)
    data = blocks(2 * BLOCKS, size)
    state, noise = mechanism.init_state("s"), NoiseSource(TEST_KEY)
    uninterrupted = []
    for i, block in enumerate(data):
        state, releases = mechanism.step(state, block, noise)
        if i >= BLOCKS:
            uninterrupted += releases
    restored = decode_state(type(state), (FIXTURES / f"erm_v1_{name}.state").read_bytes())
    after = []
    for block in data[BLOCKS:]:
        restored, releases = mechanism.step(restored, block, NoiseSource(TEST_KEY))
        after += releases
    assert len(after) == len(uninterrupted) > 0
    for old, new in zip(after, uninterrupted):
        assert (old.step, old.epsilon_spent == pytest.approx(new.epsilon_spent, rel=REL)) == (new.step, True)
        # same solver, same noise cells: rounding only (the restored state's arrays went through the coder)
        assert_close_values(old.value, new.value, f"{name} step {old.step}", rtol=1e-9, atol=1e-12)
        assert old.noise, f"{name}: a release after the restore declares no noise"
        recomputed = recomputed_epsilon(loss_of_declaration(old.noise), old.delta_spent)
        assert recomputed == pytest.approx(old.epsilon_spent, rel=REL)
