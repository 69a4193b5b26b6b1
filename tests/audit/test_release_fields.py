"""Issue 23.5: every release field is either public under the family's stated neighbouring relation or
private-derived and covered by the accounting (the tables in docs/sums.md, docs/erm.md,
docs/growing_db.md and docs/online.md).

For each family, the mechanism runs on a stream D and on neighbours D' under its relation with the
same noise key; every release's stream, step, mechanism, spend and meta must be identical, except
the meta fields the family's table lists as private-derived. Families whose relation keeps a step's
record count private (event-time steps: counters, window tree, incremental regression) are also run
on add/remove neighbours, so a field revealing an exact count fails here. Mutant checked: adding
``"records": len(y)`` to PRIVINCREG's meta fails the add/remove case.
"""

from __future__ import annotations

import numpy as np
import pytest

from beam_dp.core import NoiseSource
from beam_dp.mechanisms.erm import LabelledRows, SoftmaxRegression
from beam_dp.mechanisms.erm.continual import ContinualReleaseMechanism
from beam_dp.mechanisms.erm.sliding import SlidingWindowMechanism
from beam_dp.mechanisms.growing_db.base import GrowingBlock, Query
from beam_dp.mechanisms.growing_db.pmwg import PMWG
from beam_dp.mechanisms.growing_db.schedulers import BBImprover, LaplaceHistogram
from beam_dp.mechanisms.online.convex_sets import L2Ball
from beam_dp.mechanisms.online.learners import WDPCOCOP
from beam_dp.mechanisms.online.regression import RegressionBlock, make_incremental_regression
from beam_dp.mechanisms.sums.factory import make_counter
from beam_dp.mechanisms.sums.window_tree import WindowTreeSum
from tests.conftest import TEST_KEY

# meta fields that are private-derived (outputs of a DP test, covered by its accounting)
PMWG_PRIVATE = {"hard", "sign", "segment_index", "hard_count", "beta_bound", "unchecked"}


def _vectors(*values: float) -> list[np.ndarray]:
    return [np.array([v]) for v in values]


def _reg(rows: list[tuple[float, float, float]]) -> RegressionBlock:
    return RegressionBlock(np.array([[a, b] for a, b, _ in rows]).reshape(-1, 2), np.array([c for _, _, c in rows]))


def _erm(seed: int, replace: bool = False) -> list[LabelledRows]:
    rng = np.random.default_rng(seed)
    blocks = [LabelledRows(rng.normal(size=(2, 1)), rng.integers(0, 2, 2)) for _ in range(8)]
    if replace:  # the same positions, one value replaced
        X = blocks[2].features.copy()
        X[1] = [5.0]
        blocks[2] = LabelledRows(X, 1 - blocks[2].labels)
    return blocks


def _erm_family(mechanism, seed: int, **schedule) -> tuple:
    """An ERM family entry: blocks of 2 rows, the neighbour replaces one value at the same position."""
    model = SoftmaxRegression(n_features=1, n_classes=2)
    return (lambda: mechanism(model=model, lam=1.0, epsilon=1.0, **schedule), _erm(seed), [_erm(seed, replace=True)],
            set())


def _growing(elements: list[int]) -> list[GrowingBlock]:
    queries = (Query(4, "a", np.array([1.0, 0, 0, 0])), Query(6, "b", np.array([0, 1.0, 1.0, 0])))
    return [GrowingBlock(np.array(elements[:4]), queries[:1]), GrowingBlock(np.array(elements[4:]), queries[1:])]


def _online(last: float) -> list:
    return [(np.array([1.0, 0.0]), 1.0), (np.array([0.0, 1.0]), -1.0), (np.array([0.5, last]), 1.0)]


# family: (mechanism factory, D, neighbours of D under its relation, private-derived meta fields)
FAMILIES = {
    "counter (replace-one and add/remove)": (
        lambda: make_counter(dim=1, clip_bound=1.0, epsilon=1.0),
        [_vectors(1.0, 0.5), None, _vectors(0.2)],
        [[_vectors(1.0), None, _vectors(0.2)], [_vectors(1.0, -0.7), None, _vectors(0.2)]],
        set(),
    ),
    "window tree (replace-one and add/remove)": (
        lambda: WindowTreeSum(dim=1, clip_bound=1.0, epsilon=1.0, window=3),
        [_vectors(1.0, 0.5), None, _vectors(0.2), _vectors(0.1)],
        [[_vectors(1.0), None, _vectors(0.2), _vectors(0.1)], [_vectors(1.0), None, _vectors(0.2, 0.3), _vectors(0.1)]],
        set(),
    ),
    "PMWG (substitution, sizes public)": (
        lambda: PMWG(universe_size=4, n=3, epsilon=1.0, alpha=0.5, xi_n=0.05),
        _growing([0, 0, 0, 0, 1, 2]),
        [_growing([0, 3, 0, 0, 1, 2]), _growing([0, 0, 0, 0, 1, 0])],
        PMWG_PRIVATE,
    ),
    "BBImprover (substitution, sizes public)": (
        lambda: BBImprover(LaplaceHistogram(4), universe_size=4, n=3, epsilon=1.0, delta=1e-6),
        _growing([0, 0, 0, 0, 1, 2]),
        [_growing([0, 3, 0, 0, 1, 2])],
        set(),
    ),
    "ERM continual (replace-one, positions public)": _erm_family(ContinualReleaseMechanism, 0, update=2, base=4),
    "ERM sliding window (replace-one, positions public)": _erm_family(SlidingWindowMechanism, 1, block=2, levels=2),
    "online learning (replace-one record per step)": (
        lambda: WDPCOCOP(dim=2, constraint=L2Ball(2), loss="logistic", mu=0.5, epsilon=1.0, window=4),
        _online(0.0),
        [_online(-3.0)],
        set(),
    ),
    "PRIVINCREG1 (replace-one and add/remove)": (
        lambda: make_incremental_regression("privincreg1", dim=2, constraint=L2Ball(2), epsilon=1.0, delta=1e-6),
        [_reg([(1, 0, 1), (0, 1, -1)]), _reg([]), _reg([(0.5, 0.5, 0.3)])],
        [[_reg([(1, 0, 1)]), _reg([]), _reg([(0.5, 0.5, 0.3)])], [_reg([(1, 0, 1), (0, 1, -1)]), _reg([(3, 3, 3)]),
                                                                   _reg([(0.5, 0.5, 0.3)])]],
        set(),
    ),
    "PRIVINCERM (replace-one and add/remove)": (
        lambda: make_incremental_regression("privincerm", dim=2, constraint=L2Ball(2), epsilon=1.0, delta=1e-6,
                                            horizon=4),
        [_reg([(1, 0, 1), (0, 1, -1)]), _reg([]), _reg([(0.5, 0.5, 0.3)]), _reg([(0.1, 0.2, 0.3)])],
        [[_reg([(1, 0, 1)]), _reg([]), _reg([(0.5, 0.5, 0.3)]), _reg([(0.1, 0.2, 0.3)])]],
        set(),
    ),
}


def _public_view(releases: list, private: set[str]) -> list[tuple]:
    """Everything a release says except its value and the private-derived meta fields; floats in the
    meta are public arithmetic on the same public inputs, so equal runs give equal bits."""
    return [(r.stream, r.step, r.mechanism, r.epsilon_spent, r.delta_spent,
             {k: v for k, v in r.meta.items() if k not in private}) for r in releases]


def _releases(mech, blocks: list) -> list:
    state, out = mech.init_state("s"), []
    for block in blocks:
        state, rel = mech.step(state, block, NoiseSource(TEST_KEY))
        out.extend(rel)
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_release_fields_are_public_under_the_stated_relation(family):
    make, data, neighbours, private = FAMILIES[family]
    mech = make()
    base = _releases(mech, data)
    assert base, "the scenario must release something"
    for other in neighbours:
        assert _public_view(_releases(mech, other), private) == _public_view(base, private)
