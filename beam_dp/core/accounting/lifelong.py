"""Privacy arithmetic of the lifelong learners (no torch; dp-accounting and scipy imported on first use).

* L2DP-ML (Lai et al., "Lifelong DP: Consistently Bounded Differential Privacy in Lifelong Machine Learning"): the sensitivities ``Δ_R = d(β + 2)`` and
  ``Δ_L = 2(n_π + 1)``, the Theorem 2 total ``ε = ε_1 + ε_1/γ_x + ε_1/γ + ε_2`` with
  ``γ_x = Δ_R/λ`` and ``1/γ ≤ λ B_θ / (2 Δ_R)`` (the entrywise clip of §4.2), and the split of a
  target ε into ``(ε_1, ε_2)`` (§4.3). This total is the *paper's claim* (§4.4), not a standard proof.
* DP-SGD learners: the Poisson-subsampled Gaussian mechanism (add/remove-one neighbours; the sampling
  rate and the step count are functions of the *declared* public task size, never of the true one),
  accounted by dp-accounting's **PLD** accountant (default, ``accountant="pld"``): the pessimistic
  connect-the-dots privacy loss distribution on a grid of :data:`PLD_INTERVAL` nats, composed by FFT with
  the truncated tail mass counted as δ, so the reported ε is an upper bound on the mechanism's ε (within
  ~1% of the exact value at q = 32/60 000 and 1 875 steps); or by its **RDP** accountant on the
  :data:`RDP_ORDERS` grid (``accountant="rdp"``: sound, looser: 1.25x to 7x PLD's ε in that setting).
  A noise multiplier is calibrated by the same accountant: PLD to the :data:`PLD_Z_GRID` grid by bisection,
  rounded up and checked to stay within the target; RDP to 1e-9 relative, checked likewise.
  ``dpsgd_noise_multiplier`` and ``dpsgd_epsilon`` are memoised on their public inputs (a pure function
  of them: the same on every worker), so a learner pays the accountant once per distinct task shape,
  never inside its step loop. ``dpsgd_pld_spend`` / ``dpsgd_spend`` are the ``(ε, δ)`` a learner reports
  and the account kinds ``"dpsgd_pld"`` (naming the interval) / ``"dpsgd"`` (RDP) a release declares, so
  ``python -m beam_dp.verify`` recomputes it from the release's public parameters.
"""

from __future__ import annotations

import functools
import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import dp_accounting

__all__ = [
    "ACCOUNTANTS",
    "L2DPBudget",
    "PLD_INTERVAL",
    "PLD_Z_GRID",
    "RDP_ORDERS",
    "accountant_label",
    "calibrate_noise_multiplier",
    "check_accountant",
    "dpsgd_epsilon",
    "dpsgd_event",
    "dpsgd_account",
    "dpsgd_noise_multiplier",
    "dpsgd_pld_spend",
    "dpsgd_spend",
    "epsilon_of",
    "example_event",
    "l2dp_budget",
    "l2dp_claim",
    "sensitivity_label",
    "sensitivity_reconstruction",
    "theorem2_epsilon",
]


def sensitivity_reconstruction(input_dim: int, hidden: int) -> float:
    """``Δ_R = d(β + 2)`` of the first-order reconstruction coefficients (dense layer)."""
    if input_dim < 1 or hidden < 1:
        raise ValueError("input_dim and hidden must be >= 1")
    return float(input_dim * (hidden + 2))


def sensitivity_label(last_hidden: int) -> float:
    """``Δ_L = 2(n_π + 1)`` of the label coefficients with the constant bias unit."""
    if last_hidden < 1:
        raise ValueError("last_hidden must be >= 1")
    return float(2 * (last_hidden + 1))


@dataclass(frozen=True)
class L2DPBudget:
    """The split of a target ε between the two functional mechanisms, with the sensitivities used."""

    epsilon: float
    epsilon_1: float
    epsilon_2: float
    delta_r: float
    delta_l: float

    def total(self, batch_size: int, b_theta: float) -> float:
        """Theorem 2 with Algorithm 2's γ's (:func:`theorem2_epsilon`)."""
        return theorem2_epsilon(self.epsilon_1, self.epsilon_2, batch_size, b_theta, self.delta_r)


def theorem2_epsilon(epsilon_1: float, epsilon_2: float, batch_size: int, b_theta: float, delta_r: float) -> float:
    """Theorem 2 with Algorithm 2's γ's: ``ε_1(1 + λ/Δ_R + λB_θ/(2Δ_R)) + ε_2``."""
    lam = float(batch_size)
    return epsilon_1 * (1.0 + lam / delta_r + lam * b_theta / (2.0 * delta_r)) + epsilon_2


def l2dp_claim(delta_r: float, delta_l: float, scale_chi1: float, scale_chi2: float, scale_chi3: float,
               batch_size: float, b_theta: float) -> tuple[float, float]:
    """``(ε, 0)`` of L2DP-ML's one-time Laplace draws by the paper's Theorem 2 (a *claim*, see above):
    ``ε_1 = Δ_R/min(scale_χ1, scale_χ2)``, ``ε_2 = Δ_L/scale_χ3``, :func:`theorem2_epsilon`. The spend the
    learner reports and the account kind ``"l2dp_ml"`` its releases declare; ``ValueError`` out of range."""
    values = (delta_r, delta_l, scale_chi1, scale_chi2, scale_chi3, batch_size, b_theta)
    if not all(math.isfinite(v) and v > 0 for v in values) or not float(batch_size).is_integer():
        raise ValueError(f"an L2DP-ML account needs finite parameters > 0 and an integer batch size; got {values}")
    eps1, eps2 = delta_r / min(scale_chi1, scale_chi2), delta_l / scale_chi3
    return theorem2_epsilon(eps1, eps2, int(batch_size), b_theta, delta_r), 0.0


def l2dp_budget(epsilon: float, rho_s: float, batch_size: int, b_theta: float, delta_r: float,
                delta_l: float) -> L2DPBudget:
    """Split a target ε: ``ε_2 = (1−ρ_s)ε``, ``ε_1 = ρ_s ε / (1 + λ/Δ_R + λB_θ/(2Δ_R))``."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if not 0.0 < rho_s < 1.0:
        raise ValueError(f"rho_s must lie in (0, 1), got {rho_s!r}")
    if not (math.isfinite(b_theta) and b_theta > 0):
        raise ValueError(f"b_theta must be a finite number > 0, got {b_theta!r}")
    lam = float(batch_size)
    eps1 = rho_s * epsilon / (1.0 + lam / delta_r + lam * b_theta / (2.0 * delta_r))
    return L2DPBudget(float(epsilon), eps1, (1.0 - rho_s) * epsilon, float(delta_r), float(delta_l))


_ABSL = logging.getLogger("absl")
#: the accountants a DP-SGD learner may use; the first is the default
ACCOUNTANTS = ("pld", "rdp")
# RDP orders: a coarser grid than dp-accounting's default (≈5× faster calibrations; any grid is sound,
# a coarser one can only report a slightly larger ε).
RDP_ORDERS = (1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 32.0, 48.0,
              64.0, 128.0, 256.0, 512.0)
#: PLD discretisation: privacy-loss grid step (nats) of dp-accounting's pessimistic connect-the-dots PLD
PLD_INTERVAL = 1e-4
#: the PLD calibration's grid: a calibrated noise multiplier is the multiple of this found by bisection,
#: rounded up, whose ε is at most the target
PLD_Z_GRID = 1e-6
#: range a declared PLD interval must lie in (a finer one would make the verifier's PLD arbitrarily large)
PLD_INTERVAL_RANGE = (1e-6, 1.0)


def accountant_label(accountant: str) -> str:
    """The ``accountant`` a release's meta names: the accountant and its discretisation."""
    if accountant == "pld":
        return f"dp-accounting PLD (pessimistic connect-the-dots, interval {PLD_INTERVAL:g})"
    return f"dp-accounting RDP ({len(RDP_ORDERS)} orders {RDP_ORDERS[0]:g}..{RDP_ORDERS[-1]:g})"


def check_accountant(accountant: str) -> str:
    """``accountant`` if it is one of :data:`ACCOUNTANTS` (``ValueError`` otherwise)."""
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
    return accountant


def _dp() -> Any:
    """dp-accounting, imported on first use (about a second): a verifier of jobs without DP-SGD never loads it."""
    import dp_accounting
    import dp_accounting.pld
    import dp_accounting.rdp

    return dp_accounting


def _rdp_accountant() -> Any:
    return _dp().rdp.RdpAccountant(list(RDP_ORDERS))


@contextmanager
def _quiet_accountant():
    """dp-accounting logs a warning for every RDP order it drops (a conservative choice); keep it quiet."""
    level = _ABSL.level
    _ABSL.setLevel(logging.ERROR)
    try:
        yield
    finally:
        _ABSL.setLevel(level)


def dpsgd_event(q: float, noise_multiplier: float, steps: int) -> dp_accounting.DpEvent:
    """``steps`` compositions of the Poisson-subsampled Gaussian (rate ``q``; ``q = 1``: no sampling)."""
    dp = _dp()
    if steps <= 0:
        return dp.NoOpDpEvent()
    gauss = dp.GaussianDpEvent(noise_multiplier)
    one = gauss if q >= 1.0 else dp.PoissonSampledDpEvent(q, gauss)
    return dp.SelfComposedDpEvent(one, int(steps))


def epsilon_of(event: dp_accounting.DpEvent, delta: float, accountant: str = "rdp",
               interval: float = PLD_INTERVAL) -> float:
    """ε at ``delta`` of an event (add/remove-one neighbours) under dp-accounting's RDP accountant on
    :data:`RDP_ORDERS` or, ``accountant="pld"``, its PLD accountant with grid step ``interval``
    (pessimistic: an upper bound on the event's ε at any interval, tighter as it shrinks)."""
    if check_accountant(accountant) == "pld":
        pld = _dp().pld.PLDAccountant(value_discretization_interval=interval)
        return float(pld.compose(event).get_epsilon(delta))
    with _quiet_accountant():
        return float(_rdp_accountant().compose(event).get_epsilon(delta))


def _calibrate_rdp(make_event: Callable[[float], dp_accounting.DpEvent], epsilon: float, delta: float) -> float:
    """Smallest ``z`` (to 1e-9 relative) whose event spends at most ``epsilon`` under RDP."""
    dp = _dp()
    with _quiet_accountant():
        z = float(dp.calibrate_dp_mechanism(_rdp_accountant, make_event, epsilon, delta,
                                            dp.LowerEndpointAndGuess(1e-3, 1.0), tol=1e-9))
    while epsilon_of(make_event(z), delta) > epsilon:  # land on the private side of the bracket
        z *= 1.0 + 1e-9
    return z


def _calibrate_pld(make_event: Callable[[float], dp_accounting.DpEvent], epsilon: float, delta: float) -> float:
    """Smallest multiple of :data:`PLD_Z_GRID` whose event spends at most ``epsilon`` under PLD.

    A bracket from a 10× coarser grid (cheap: its root is found first, bracketed by the RDP value, which
    bounds the same ε from above, and 0.6× it), then Brent's bisection on the :data:`PLD_INTERVAL` grid
    to ``PLD_Z_GRID / 4`` in ``[0.99, 1]×`` the coarse root (widened until it brackets); the root is
    rounded UP to the grid and stepped up until the PLD ε of the returned value is at most ``epsilon``
    (checked, so a non-monotone discretisation cannot break the target)."""
    from scipy import optimize

    fine = functools.lru_cache(maxsize=None)(lambda z: epsilon_of(make_event(z), delta, "pld"))
    coarse = functools.lru_cache(maxsize=None)(
        lambda z: epsilon_of(make_event(z), delta, "pld", 10 * PLD_INTERVAL))

    def root(spent: Callable[[float], float], hi: float, shrink: float, xtol: float) -> float:
        while spent(hi) > epsilon:
            hi /= shrink
        lo = shrink * hi
        while spent(lo) <= epsilon:
            if lo < 1e-6:
                return lo
            hi, lo = lo, shrink * lo
        return optimize.brentq(lambda z: spent(z) - epsilon, lo, hi, xtol=xtol)

    guess = root(coarse, _calibrate_rdp(make_event, epsilon, delta), 0.6, PLD_Z_GRID)
    k = math.ceil(root(fine, guess, 0.99, PLD_Z_GRID / 4) / PLD_Z_GRID - 1e-9)
    while fine(round(k * PLD_Z_GRID, 12)) > epsilon:
        k += 1
    return round(k * PLD_Z_GRID, 12)


def calibrate_noise_multiplier(make_event: Callable[[float], dp_accounting.DpEvent], epsilon: float,
                               delta: float, accountant: str = "rdp") -> float:
    """Smallest noise multiplier ``z`` whose event spends at most ``epsilon`` at ``delta``: under RDP to
    1e-9 relative; under PLD (``accountant="pld"``) the smallest multiple of :data:`PLD_Z_GRID` (bisection,
    rounded up, checked)."""
    if not (math.isfinite(epsilon) and epsilon > 0) or not 0.0 < delta < 1.0:
        raise ValueError(f"need epsilon > 0 and delta in (0, 1), got {epsilon!r}, {delta!r}")
    if check_accountant(accountant) == "pld":
        return _calibrate_pld(make_event, epsilon, delta)
    return _calibrate_rdp(make_event, epsilon, delta)


def example_event(q: float, z: float, steps: int, memory_z: float | None = None,
                  memory_uses: int = 0) -> dp_accounting.DpEvent:
    """One example's whole participation: ``steps`` Poisson(q) Gaussian steps at ``z`` and, when
    ``memory_z`` is given, ``memory_uses`` unsampled Gaussian uses at ``memory_z`` (its memory batch)."""
    task = dpsgd_event(q, z, steps)
    if memory_z is None:
        return task
    return _dp().ComposedDpEvent([task, dpsgd_event(1.0, memory_z, memory_uses)])


@functools.lru_cache(maxsize=1024)
def dpsgd_noise_multiplier(q: float, steps: int, epsilon: float, delta: float, memory_z: float | None = None,
                           memory_uses: int = 0, accountant: str = "rdp") -> float:
    """Smallest ``z`` whose :func:`example_event` spends at most ``epsilon`` at ``delta`` under
    ``accountant`` (memoised: a pure function of public parameters)."""
    return calibrate_noise_multiplier(lambda z: example_event(q, z, steps, memory_z, memory_uses), epsilon, delta,
                                      accountant)


def _checked(sampling_rate: float, noise_multiplier: float, steps: float, delta: float,
             memory_noise_multiplier: float | None, memory_uses: float) -> tuple:
    """The parameters of a DP-SGD account as ``(q, z, steps, delta, memory_z, memory_uses)`` (``ValueError``
    out of range; counts may come as floats from JSON)."""
    counts_ok = all(float(c).is_integer() and c >= 0 for c in (steps, memory_uses))
    memory_ok = memory_noise_multiplier is None or (math.isfinite(memory_noise_multiplier)
                                                    and memory_noise_multiplier > 0)
    if not (0.0 < sampling_rate <= 1.0 and math.isfinite(noise_multiplier) and noise_multiplier > 0 and counts_ok
            and 0.0 < delta < 1.0 and memory_ok):
        raise ValueError(f"a DP-SGD account needs sampling_rate in (0, 1], noise multipliers > 0, counts >= 0 and "
                         f"delta in (0, 1); got {sampling_rate!r}, {noise_multiplier!r}, {steps!r}, {delta!r}, "
                         f"{memory_noise_multiplier!r}, {memory_uses!r}")
    memory_z = None if memory_noise_multiplier is None else float(memory_noise_multiplier)
    return float(sampling_rate), float(noise_multiplier), int(steps), float(delta), memory_z, int(memory_uses)


def dpsgd_spend(sampling_rate: float, noise_multiplier: float, steps: float, delta: float,
                memory_noise_multiplier: float | None = None, memory_uses: float = 0) -> tuple[float, float]:
    """``(ε, δ)`` of one example's participation (:func:`example_event` at ``delta``) under RDP on
    :data:`RDP_ORDERS`: the spend of a learner with ``accountant="rdp"`` and the account kind ``"dpsgd"``
    its releases declare (:mod:`beam_dp.core.noise_declaration`). ``ValueError`` out of range."""
    args = _checked(sampling_rate, noise_multiplier, steps, delta, memory_noise_multiplier, memory_uses)
    return dpsgd_epsilon(*args), float(delta)


def dpsgd_pld_spend(sampling_rate: float, noise_multiplier: float, steps: float, delta: float,
                    value_discretization_interval: float, memory_noise_multiplier: float | None = None,
                    memory_uses: float = 0) -> tuple[float, float]:
    """``(ε, δ)`` of one example's participation (:func:`example_event` at ``delta``) under dp-accounting's
    PLD accountant (add/remove one, pessimistic estimate) with grid step ``value_discretization_interval``:
    the spend of a learner with ``accountant="pld"`` (default) and the account kind ``"dpsgd_pld"`` its
    releases declare. ``ValueError`` out of range (the interval within :data:`PLD_INTERVAL_RANGE`)."""
    args = _checked(sampling_rate, noise_multiplier, steps, delta, memory_noise_multiplier, memory_uses)
    low, high = PLD_INTERVAL_RANGE
    if not low <= value_discretization_interval <= high:
        raise ValueError(f"a PLD account needs value_discretization_interval in [{low:g}, {high:g}], got "
                         f"{value_discretization_interval!r}")
    return dpsgd_epsilon(*args, "pld", float(value_discretization_interval)), float(delta)


def dpsgd_account(accountant: str, sampling_rate: float, noise_multiplier: float, steps: int, delta: float,
                  memory_noise_multiplier: float | None = None, memory_uses: int = 0) -> tuple[str, dict]:
    """``(kind, parameters)`` of the account a learner with ``accountant`` declares (``"dpsgd_pld"`` names
    its discretisation :data:`PLD_INTERVAL`; ``"dpsgd"`` is RDP on :data:`RDP_ORDERS`)."""
    params = dict(sampling_rate=sampling_rate, noise_multiplier=noise_multiplier, steps=steps, delta=delta)
    if memory_noise_multiplier is not None:
        params.update(memory_noise_multiplier=memory_noise_multiplier, memory_uses=memory_uses)
    if check_accountant(accountant) == "pld":
        return "dpsgd_pld", {**params, "value_discretization_interval": PLD_INTERVAL}
    return "dpsgd", params


@functools.lru_cache(maxsize=1024)
def dpsgd_epsilon(q: float, z: float, steps: int, delta: float, memory_z: float | None = None,
                  memory_uses: int = 0, accountant: str = "rdp", interval: float = PLD_INTERVAL) -> float:
    """ε at ``delta`` of :func:`example_event` under ``accountant`` (memoised: a pure function of public
    parameters)."""
    return epsilon_of(example_event(q, z, steps, memory_z, memory_uses), delta, accountant, interval)
