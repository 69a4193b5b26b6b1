"""Drivers of the growing-database and lifelong-learning audits (``test_audit_growing_lifelong.py``).

Both return ``sample(factor) -> (statistics under D, statistics under D')`` for
:func:`beam_dp.testing.audit.audit_with_mutant`: ``runs`` independent runs per neighbour, each with a
fresh key ``seeded_key(seed, b"D" | b"D'")``; ``factor = 1`` is the honest mechanism, ``0.5`` the mutant.

* :func:`growing_samples` — a growing-database mechanism fed one block ``[first] + rest`` (the
  neighbours differ in the first element, which is present from t = 1 ≤ n, so it is in every run);
  the mutant is either :class:`ScaledNoise` (Laplace-type noise) or :class:`EpsilonBoost` (a black box
  run at ε/factor: for exponential mechanisms, whose Gumbel draws ScaledNoise does not touch).
* :func:`learner_samples` — a lifelong learner trained on one task; the statistic is ``w · θ`` (all
  released weights flattened) with ``w = θ_D' − θ_D`` from noise-free (``ZeroNoise``) runs. The public
  coins (initial weights, Poisson sampling, memory choice) are fixed across runs
  (:class:`FixedCoins`): privacy must hold for any fixed initialisation, and an auditor that knows it
  is the worst case.
* :func:`discrete_laplace_epsilon` — the exact (pessimistic PLD) ε at δ of a composition of discrete
  Laplace coordinates: the true privacy of LaplaceHistogram runs, used where a mutant cannot be flagged.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pld

from beam_dp.mechanisms.growing_db.base import GrowingBlock, Query
from beam_dp.testing import ZeroNoise
from beam_dp.testing.audit import ScaledNoise, seeded_key

Sampler = Callable[[float], tuple[np.ndarray, np.ndarray]]
SIDES = (b"D", b"D'")
_COINS = ZeroNoise()


class EpsilonBoost:
    """MUTANT black box (tests only): runs ``box`` with ``factor`` × the ε its scheduler passes (α, β
    unchanged), while the scheduler still claims the original ε."""

    def __init__(self, box, factor: float):
        self.box, self.factor = box, float(factor)
        self.name, self.p, self.g = box.name, box.p, box.g

    def run(self, counts, t, epsilon, alpha, beta, noise):
        return self.box.run(counts, t, epsilon * self.factor, alpha, beta, noise)

    def answer(self, synopsis, weights):
        return self.box.answer(synopsis, weights)

    def histogram(self, synopsis):
        return self.box.histogram(synopsis)


def growing_samples(make: Callable[[float], object], firsts: tuple[int, int], rest: Sequence[int],
                    statistic: Callable[[list], float], runs: int, mutant: str = "noise",
                    query_sizes: Sequence[int] = ()) -> tuple[Sampler, list]:
    """``make(boost)`` builds the mechanism (its black box wrapped in ``EpsilonBoost(box, boost)`` when
    ``boost != 1``); ``mutant``: ``"noise"`` (ScaledNoise(key, factor)) or ``"epsilon"`` (boost 1/factor).
    ``firsts``: the first element under D and D'; ``query_sizes``: sizes at which a query (the indicator
    of the element 0) is asked (BBImprover runs only when queried). Also returns the noise-free releases
    under D' (their ``epsilon_spent``/``delta_spent`` are the claim, their ``epsilon_run`` the runs' ε)."""
    if mutant not in ("noise", "epsilon"):
        raise ValueError(f"mutant must be 'noise' or 'epsilon', got {mutant!r}")

    def blocks(mech) -> list[GrowingBlock]:
        indicator = np.eye(1, mech.universe_size)[0]
        queries = tuple(Query(t, f"q{t}", indicator) for t in query_sizes)
        return [GrowingBlock(np.array([first, *rest]), queries) for first in firsts]

    def run(mech, block, noise):
        return mech.step(mech.init_state("audit"), block, noise)[1]

    def sample(factor: float):
        mech = make(1.0 / factor if mutant == "epsilon" else 1.0)
        noise_factor = factor if mutant == "noise" else 1.0
        return tuple(np.array([statistic(run(mech, block, ScaledNoise(seeded_key(s, side), noise_factor)))
                               for s in range(runs)])
                     for block, side in zip(blocks(mech), SIDES))

    honest = make(1.0)
    return sample, run(honest, blocks(honest)[1], _COINS)


class FixedCoins(ScaledNoise):
    """``ScaledNoise`` whose ``generator()`` (initial weights, sampling, memory choice) is ZeroNoise's:
    the same public coins in every run (and in the noise-free ZeroNoise runs); only the Gaussian
    draws are fresh and scaled."""

    def generator(self, stream, purpose, *index):
        return _COINS.generator(stream, purpose, *index)


def _weights(release) -> np.ndarray:
    return np.concatenate([np.ravel(release.value[k]) for k in sorted(release.value)])


def learner_samples(learner, task_d, task_dp, runs: int) -> tuple[Sampler, object, np.ndarray]:
    """One task per run; statistic ``w · θ``. Also returns the noise-free release under D' (its
    ``epsilon_spent``/``delta_spent`` are the claim) and ``w`` (the noise-free release difference D' − D)."""

    def release(task, noise):
        return learner.step(learner.init_state("audit"), task, noise)[1][0]

    reference = release(task_dp, _COINS)
    w = _weights(reference) - _weights(release(task_d, _COINS))

    def sample(factor: float):
        return tuple(np.array([w @ _weights(release(task, FixedCoins(seeded_key(s, side), factor)))
                               for s in range(runs)])
                     for task, side in zip((task_d, task_dp), SIDES))

    return sample, reference, w


def discrete_laplace_epsilon(parameters: Sequence[float], delta: float) -> float:
    """ε at δ (pessimistic PLD, an upper bound) of composed discrete Laplace mechanisms of sensitivity 1,
    ``parameters`` = 1/scale of each coordinate."""
    total = None
    for a in parameters:
        one = pld.from_discrete_laplace_mechanism(a, sensitivity=1)
        total = one if total is None else total.compose(one)
    return float(total.get_epsilon_for_delta(delta))
