"""Shared machinery of the ERM release mechanisms: configuration, one private training call
(Algorithm 1 / PBERM: certified solve + output perturbation), the per-element ledger and releases.

Privacy of one training call: a certified call on a member set with public normaliser ``n_norm``
has L2 sensitivity ``Δ(n_norm) = (1 + s)·L/(λ n_norm)``: ``L/(λn)`` is how far the exact minimisers
of neighbouring member sets can lie apart (F is 2λ-strongly convex), ``s·L/(2λn)`` how far the
returned point can lie from its exact minimiser (``solver.certified_slack``: the stopping target
τ·L/n plus float64 rounding headroom; ``s = 2τ = 2·10⁻³`` by default, so Δ ≈ 1.002·L/(λn)). A call
whose point fails its test is refused (``solver.CertificateError``). ``calibration="spec"``,
uncertified SGD and the as-published mode use the spec's ``Δ = 2L/(λn)`` (the paper's calibration). Each event records
its ``sensitivity`` and ``sensitivity_slack``; :func:`call_sensitivity` recomputes them from the
public parameters.

* ``noise="gamma"`` (pure ε): ``ŵ + ν`` with ν ~ K-norm, ``‖ν‖ ~ Gamma(d, b)``, uniform direction
  (``NoiseSource.k_norm``; never coordinate Laplace). Cost ``Δ/b``; on a Bernoulli(p) subsample
  of the members ``ln(1 + p(e^{Δ/b} − 1))``.
* ``noise="gaussian"`` ((ε, δ)): ``ν ~ N(0, σ² I_d)``, a Gaussian charge ``μ = Δ/σ``. An element's
  charges compose exactly into one Gaussian mechanism with ``μ = sqrt(Σ μ_i²)`` (Gaussian
  differential privacy); the budget ``μ*`` is the analytic-Gaussian ``μ`` of ``(ε, δ)``
  (``1/analytic_gaussian_sigma(ε, δ, 1)``) and each algorithm splits ``μ*²`` over its geometric
  schedule. ``beam_dp.core.accounting.erm.pld_epsilon`` re-derives the same ε with dp-accounting's PLD accountant.

**As-published calibration — NOT PRIVATE** (``as_published_not_private=True``, research use only, to
draw the paper's figures beside the certified ones; the Beam transforms cannot request it): the
paper's own noise, coordinate-wise ``Lap(b)`` on every one of the d parameters, with
``b = 2L_data/(λ n ε_call)`` and the data-dependent Lipschitz constant of its text,
``L_data = (C − 1)/(2 m C)·‖X‖_F`` over the m (clipped, bias-augmented) rows of the call. Neither
part is ε-DP: coordinate Laplace needs L1 sensitivity (up to √d·Δ), and ``L_data`` is computed
from the private rows and shrinks like 1/√m. Construction warns (``NotPrivateWarning``); every
release carries ``meta["not_private"] = True``, ``epsilon_spent = inf``, ``delta_spent = 1`` and the
paper's claimed ε as ``meta["claimed_epsilon"]``.

Every training call is an *event* (a dict in the release meta ``events``) with its member ranges
(1-based inclusive positions), ``n_norm``, law, scale, sampling probability and cost, so each
element's spend can be recomputed from the release log alone (``beam_dp.core.accounting.erm_log.spend_from_log``).
Elements are ``unit``-blocks of positions (b0, B or w0) that always share every event; the state
keeps their cumulative cost (pure ε and μ²) and ``epsilon_spent`` is the maximum over them. It also
counts, per block, the calls of each noise key (``declaration``), and a release declares the noise
of a worst block (``Release.noise``) so that ``python -m beam_dp.verify`` recomputes the spend.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from beam_dp.core.accounting.erm import sampled_k_norm_loss
from beam_dp.core.calibration import analytic_gaussian_epsilon, analytic_gaussian_sigma
from beam_dp.core.clipping import clip_l2
from beam_dp.core.grid import power_of_two_at_least, snap_sum
from beam_dp.core.guarantee import Guarantee
from beam_dp.core.noise import NoiseSource
from beam_dp.core.release import Release
from beam_dp.core.state import decode_state, encode_state
from beam_dp.mechanisms.erm.declaration import count_charge, declaration_of
from beam_dp.mechanisms.erm.iteration import SolveResult
from beam_dp.mechanisms.erm.models import LinearModel
from beam_dp.mechanisms.erm.solver import (
    Backend,
    CertificateError,
    SGDConfig,
    certified_slack,
    certified_solve,
    resolve_backend,
    sgd_solve,
)
from beam_dp.mechanisms.torch_device import check_device

__all__ = ["ERMMechanism", "LabelledRows", "NEIGHBOURING", "NotPrivateWarning", "TrainedModel", "call_sensitivity",
           "is_power_of_two", "sampling_probability"]

NoiseLaw = Literal["gamma", "gaussian"]
Calibration = Literal["certified", "spec"]
NEIGHBOURING = "event-level: replace one element's value at one stream position (absence = null element)"


NOT_PRIVATE_LAW = "coordinate_laplace_data_L_NOT_PRIVATE"


class NotPrivateWarning(UserWarning):
    """Raised (as a warning) when a mechanism is built in a mode whose releases are NOT differentially private."""


def is_power_of_two(i: int) -> bool:
    return i >= 1 and (i & (i - 1)) == 0


def call_sensitivity(model: LinearModel, lam: float, n_norm: int, tolerance: float | None,
                     granularity: float | None = None) -> float:
    """L2 sensitivity of one training call at public normaliser ``n_norm``: ``(1 + s)·L/(λn)`` with
    ``s = solver.certified_slack(tolerance, n_norm)`` for a certified call stopped at
    ``‖∇F‖ ≤ tolerance·L/n``; ``tolerance=None``: the spec's ``2L/(λn)`` (``s = 1``: uncertified SGD,
    the as-published mode, ``calibration="spec"``). Plus ``√d·g`` when snapped to the grid ``g``."""
    slack = 1.0 if tolerance is None else certified_slack(tolerance, n_norm)
    grid = 0.0 if granularity is None else math.sqrt(model.dim) * granularity
    return model.sensitivity(lam, n_norm, slack) + grid


def sampling_probability(share: float, inner: float) -> float:
    """p with ln(1 + p(e^{inner} − 1)) = share."""
    return math.expm1(share) / math.expm1(inner)


@dataclass(frozen=True)
class LabelledRows:
    """A block of labelled examples: ``features`` (n, f) float, ``labels`` (n,) class indices or floats."""

    features: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return int(np.shape(self.labels)[0])


@dataclass(frozen=True)
class TrainedModel:
    """One private model: its noisy parameter vector and its training event (public facts)."""

    w: np.ndarray
    event: dict


class ERMMechanism:
    """Base of the ERM mechanisms. Subclasses define ``init_state`` and ``step``.

    Parameters common to all: ``model`` (a :class:`LinearModel`), ``lam`` (λ > 0), ``epsilon``,
    ``delta`` (0 for ``noise="gamma"``), ``noise`` ("gamma" or "gaussian"), ``backend`` of the
    certified solver and its ``tolerance`` τ (stop at ‖∇F‖ ≤ τ·L/n_norm; the sensitivity counts it,
    Δ = (1 + s)·L/(λn) with s = ``solver.certified_slack(τ, n)``), ``device`` of the torch solver
    (``"cpu"`` default, ``"cuda"``, ``"auto"``: CUDA when
    present; ignored by numpy), ``uncertified`` (replication SGD, releases marked ``certified=False``),
    ``as_published_not_private`` (the paper's calibration, NOT PRIVATE: see the module docstring;
    softmax model and ``noise="gamma"`` only), ``calibration``: ``"certified"`` (default, Δ = (1 + s)·L/(λn)
    with the solver's certified slack s) or ``"spec"`` (Δ = 2L/(λn) and that calibration's noise
    purposes: about twice the noise, the releases of streams calibrated that way reproduced exactly).
    """

    name = "erm"
    algorithm = "erm"
    state_type: type

    def __init__(self, *, model: LinearModel, lam: float, epsilon: float, delta: float = 0.0,
                 noise: NoiseLaw = "gamma", backend: Backend = "numpy", device: str = "cpu", uncertified: bool = False,
                 sgd: SGDConfig = SGDConfig(), tolerance: float = 1e-3, granularity: float | None = None,
                 as_published_not_private: bool = False, calibration: Calibration = "certified") -> None:
        if not isinstance(model, LinearModel):
            raise ValueError("model must be a SoftmaxRegression or HuberRegression")
        if not (isinstance(lam, (int, float)) and math.isfinite(lam) and lam > 0):
            raise ValueError(f"lam (λ) must be a finite number > 0, got {lam!r}")
        if noise not in ("gamma", "gaussian"):
            raise ValueError(f"noise must be 'gamma' (pure ε, K-norm) or 'gaussian' ((ε, δ)), got {noise!r}")
        if noise == "gamma" and delta != 0:
            raise ValueError("K-norm (gamma) noise gives pure ε-DP: leave delta at 0")
        if noise == "gaussian" and not (isinstance(delta, (int, float)) and 0 < delta < 1):
            raise ValueError(f"Gaussian noise needs 0 < delta < 1, got {delta!r}")
        if calibration not in ("certified", "spec"):
            raise ValueError(f"calibration must be 'certified' or 'spec', got {calibration!r}")
        self.calibration: Calibration = calibration
        if as_published_not_private is not False and as_published_not_private is not True:
            raise ValueError("as_published_not_private must be True or False")
        if as_published_not_private:
            if noise != "gamma" or model.kind != "softmax" or granularity is not None:
                raise ValueError("the as-published (NOT PRIVATE) calibration exists only for the paper's setting: "
                                 "softmax model, noise='gamma', no granularity")
            warnings.warn("ERM mechanism built with as_published_not_private=True: coordinate Laplace noise with a "
                          "data-dependent Lipschitz constant, as in the paper. Its releases are NOT PRIVATE "
                          "(epsilon_spent = inf, meta not_private = true).", NotPrivateWarning, stacklevel=2)
        self.not_private = bool(as_published_not_private)
        self.guarantee = Guarantee(epsilon, delta, NEIGHBOURING)
        self.model = model
        self.lam = float(lam)
        self.epsilon = float(epsilon)
        self.delta = float(delta)
        self.noise_law: NoiseLaw = noise
        self.backend = resolve_backend(backend)
        self.device = check_device(device)  # resolved on the worker at solve time (torch_device.resolve_device)
        self.uncertified = bool(uncertified)
        self.sgd = sgd
        if not (isinstance(tolerance, float) and 0 < tolerance <= 1):
            raise ValueError(f"tolerance must lie in (0, 1] (a fraction of L/n), got {tolerance!r}")
        self.tolerance = tolerance
        # Snapped release (docs/reliability.md §6): the model and its noise on the grid g = 2^k, added
        # exactly; rounding the model moves it by <= sqrt(d)·g/2, so Δ(n) grows by sqrt(d)·g.
        self.granularity = None if granularity is None else power_of_two_at_least(granularity)
        # μ* of the whole budget (Gaussian): the analytic-Gaussian μ of (ε, δ)
        self.mu_total = 1.0 / analytic_gaussian_sigma(self.epsilon, self.delta, 1.0) if noise == "gaussian" else 0.0

    # -- scales --------------------------------------------------------------------------------
    @property
    def certified_tolerance(self) -> float | None:
        """The solver tolerance the sensitivity is calibrated to; ``None`` (the spec's 2L/(λn)) for
        ``calibration="spec"``, uncertified SGD and the as-published mode."""
        return None if self.calibration == "spec" or self.uncertified or self.not_private else self.tolerance

    def sens(self, n_norm: int) -> float:
        """L2 sensitivity of a model trained at size ``n_norm`` (:func:`call_sensitivity`)."""
        return call_sensitivity(self.model, self.lam, n_norm, self.certified_tolerance, self.granularity)

    def scale(self, n_ref: int, eps_share: float, mu_share: float) -> float:
        """Noise scale so that a call at size ``n_ref`` costs ``eps_share`` (pure: b = Δ/ε_share) or
        has Gaussian ``μ = mu_share`` (σ = Δ/μ_share)."""
        return self.sens(n_ref) / (eps_share if self.noise_law == "gamma" else mu_share)

    # -- blocks (engine adapters) --------------------------------------------------------------
    @staticmethod
    def merge_blocks(items: list[LabelledRows]) -> LabelledRows:
        """Stack the buffered rows of one step in arrival order."""
        if not items:
            raise ValueError("empty block")
        return LabelledRows(np.concatenate([np.atleast_2d(np.asarray(i.features, dtype=np.float64)) for i in items]),
                            np.concatenate([np.atleast_1d(np.asarray(i.labels)) for i in items]))

    @staticmethod
    def block_count(item: LabelledRows) -> int:
        return len(item)

    def prepare(self, block: LabelledRows, unit: int) -> tuple[np.ndarray, np.ndarray]:
        """Validate a block of exactly ``unit`` rows; clip features and append the bias (float32 rows
        of norm ≤ R for storage) and check labels. Raises ``ValueError`` on bad input."""
        if not isinstance(block, LabelledRows):
            raise ValueError("a block must be LabelledRows(features, labels)")
        X = self.model.augment(block.features)
        if len(X) != unit:
            raise ValueError(f"a step needs exactly {unit} rows, got {len(X)}")
        y = self.model.check_labels(block.labels, unit)
        return X.astype(np.float32), y

    def encode_state(self, state) -> bytes:
        return encode_state(state)

    def decode_state(self, data: bytes):
        return decode_state(self.state_type, data)

    # -- one private training call ------------------------------------------------------------
    def _purpose(self, what: str) -> str:
        return f"erm/{self.algorithm}/{what}"

    def _noise_purpose(self, law: str) -> str:
        """The output noise's purpose: certified-slack calls draw under their own purpose, so that their
        noise is independent of a release drawn at the spec's 2L/(λn) scale under the same key."""
        return self._purpose(law if self.certified_tolerance is None else f"{law}/certified-slack")

    def sample_mask(self, noise: NoiseSource, stream: str, model_id: int, n: int, p: float) -> np.ndarray:
        """Independent Bernoulli(p) inclusion of each of ``n`` members, keyed by the model id."""
        return noise.generator(stream, self._purpose("sample"), model_id).random(n) < p

    def perturbation(self, noise: NoiseSource, stream: str, model_id: int, scale: float) -> np.ndarray:
        """The output noise ν of model ``model_id``: K-norm with scale b, or N(0, σ² I_d); coordinate
        Laplace in the NOT PRIVATE as-published mode."""
        if self.not_private:
            return noise.laplace(stream, self._purpose("laplace-not-private"), (model_id,), scale, self.model.dim)
        if self.noise_law == "gamma":
            return noise.k_norm(stream, self._noise_purpose("gamma"), (model_id,), scale, self.model.dim)
        return noise.gaussian(stream, self._noise_purpose("gaussian"), (model_id,), scale, self.model.dim)

    def train(self, *, stream: str, noise: NoiseSource, model_id: int, step: int, role: str,
              members: list[tuple[int, int]], X: np.ndarray, y: np.ndarray, n_norm: int, scale: float,
              w_ref: np.ndarray | None, w_ref_id: int, p: float = 1.0, extra: dict | None = None) -> TrainedModel:
        """Algorithm 1 (``w_ref=None``: w_ref = 0) or PBERM: train on the member rows (a Bernoulli(p)
        subsample when p < 1, drawn under purpose "sample"), perturb once under ``model_id``."""
        ref = np.zeros(self.model.dim) if w_ref is None else np.asarray(w_ref, dtype=np.float64)
        Xf = clip_l2(X.astype(np.float64), self.model.radius)[0] if len(X) else np.zeros((0, self.model.n_features + 1))
        # the paper's data-dependent L over this call's member rows, before sampling (NOT PRIVATE mode only;
        # the bias column makes ‖X‖_F ≥ √m > 0)
        l_ratio = self.published_lipschitz(Xf) / self.model.lipschitz if self.not_private and len(Xf) else 1.0
        if p < 1.0:
            keep = self.sample_mask(noise, stream, model_id, len(Xf), p)
            Xf, y = Xf[keep], y[keep]
        if self.uncertified:
            rng = noise.generator(stream, self._purpose("sgd"), model_id)
            result: SolveResult = sgd_solve(self.model, Xf, y, n_norm, self.lam, ref, rng, self.sgd)
        else:
            result = self._certified(Xf, y, n_norm, ref)
        delta_n = self.sens(n_norm)
        scale, delta_n = scale * l_ratio, delta_n * l_ratio
        nu = self.perturbation(noise, stream, model_id, scale)
        if self.noise_law == "gamma":
            eps, mu = sampled_k_norm_loss(sensitivity=delta_n, scale=scale, p=p)[0], 0.0
        else:
            eps, mu = 0.0, delta_n / scale
        event = {
            "model_id": int(model_id), "step": int(step), "role": role,
            "members": [[int(a), int(b)] for a, b in members], "n_norm": int(n_norm),
            "law": self.noise_law, "noise_scale": float(scale), "sample_p": float(p),
            "w_ref_id": int(w_ref_id), "epsilon": eps, "mu": mu,
            "certified": bool(result.certified), "solver_target": float(result.target),
            "sensitivity": float(delta_n), "sensitivity_slack": float(self.sens_slack(n_norm)), **(extra or {}),
        }
        if self.not_private:
            event.update(law=NOT_PRIVATE_LAW, not_private=True)
        return TrainedModel(self._add_noise(result.w, nu), event)

    def sens_slack(self, n_norm: int) -> float:
        """The slack ``s`` of :meth:`sens` (``Δ = (1 + s)·L/(λn) + √d·g``): 1 at the spec's bound."""
        tolerance = self.certified_tolerance
        return 1.0 if tolerance is None else certified_slack(tolerance, n_norm)

    def _certified(self, X: np.ndarray, y: np.ndarray, n_norm: int, ref: np.ndarray) -> SolveResult:
        """The certified solve on this mechanism's backend and (torch) device; a point that fails its
        stopping test is refused (``CertificateError``): the sensitivity assumes it passed."""
        result = certified_solve(self.model, X, y, n_norm, self.lam, ref, self.backend, self.tolerance, self.device)
        if not result.grad_norm <= result.target:
            raise CertificateError(f"model {self.algorithm}: the certified solver's point fails its stopping test "
                                   f"‖∇F‖ <= {self.tolerance:g}·L/n at n_norm={n_norm}: call refused")
        return result

    def published_lipschitz(self, X: np.ndarray) -> float:
        """The paper's data-dependent constant ``(C − 1)/(2 m C)·‖X‖_F`` over the m rows of one call
        (as-published mode only: it reads the private rows, so it is NOT a private quantity)."""
        c, m = self.model.n_classes, max(len(X), 1)
        return (c - 1) / (2 * m * c) * float(np.linalg.norm(X))

    def _add_noise(self, w: np.ndarray, nu: np.ndarray) -> np.ndarray:
        """``w + ν``; snapped: ``(rint(w/g) + rint(ν/g))·g`` in exact integer grid units."""
        if self.granularity is None:
            return w + nu
        return snap_sum(w, nu, self.granularity)

    # -- ledger (per unit block) ----------------------------------------------------------------
    def charge(self, spend: np.ndarray, keys: np.ndarray, counts: np.ndarray, event: dict, unit: int,
               offset_block: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Add ``event``'s cost to the unit blocks of its members and count it under its noise key
        (``declaration.count_charge``). ``spend`` is (n_blocks, 2): columns (pure ε, μ²), ``counts``
        (n_blocks, V); row r is block ``offset_block + r + 1`` (1-based). Both change in place;
        returns ``(keys, counts)``, grown when the event's key is new."""
        key = (self.sens(event["n_norm"]), event["noise_scale"], event["sample_p"])
        for a, b in event["members"]:
            lo, hi = (a - 1) // unit - offset_block, b // unit - offset_block
            spend[lo:hi, 0] += event["epsilon"]
            spend[lo:hi, 1] += event["mu"] ** 2
            keys, counts = count_charge(keys, counts, key, lo, hi)
        return keys, counts

    def worst(self, spend: np.ndarray, keys: np.ndarray, counts: np.ndarray,
              departed: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, str]:
        """The worst per-block loss (max pure ε, max μ²) over the blocks of ``spend`` and a
        ``departed`` block's ``(spend row, counts row)``, and the noise declaration of a block that has
        it (``""`` in the NOT PRIVATE mode, whose scales are data-dependent, and for uncertified SGD
        solutions, whose sensitivity Δ(n) is not proven: the verifier then cannot pass them)."""
        column = 0 if self.noise_law == "gamma" else 1
        i = int(np.argmax(spend[:, column]))
        worst, block = spend.max(axis=0), counts[i]
        if departed is not None:
            worst = np.maximum(departed[0], worst)
            if departed[0][column] > spend[i, column]:
                block = departed[1]
        return worst, ("" if self.not_private or self.uncertified else declaration_of(self.noise_law, keys, block))

    def spent(self, worst: np.ndarray) -> tuple[float, float]:
        """``(epsilon_spent, delta_spent)`` of the worst per-block loss (max pure ε, max μ²)."""
        if self.noise_law == "gamma":
            return float(worst[0]), 0.0
        if worst[1] <= 0.0:
            return 0.0, 0.0
        return analytic_gaussian_epsilon(math.sqrt(worst[1]), self.delta), self.delta

    def release(self, stream: str, step: int, model: TrainedModel, worst: tuple[np.ndarray, str], *, chain: list,
                events: list[dict]) -> Release:
        """The release of ``model`` with the ``worst`` per-block loss and its noise declaration
        (:meth:`worst`): value {"weights", "intercepts"}; meta = its event, ``chain``
        (``[model_id, first, last]`` from this model to the root of its regulariser chain), ``covers``
        (the positions the chain was trained on), ``events`` (every training call of this step
        not logged by another release) and the model description."""
        worst_loss, declared = worst
        eps, delta = self.spent(worst_loss)
        covers = _union([(a, b) for _, a, b in chain])
        flag = {}
        if self.not_private:
            flag = {"not_private": True, "claimed_epsilon": eps,
                    "calibration": "as published (NOT PRIVATE): coordinate Laplace, data-dependent L"}
            eps, delta = math.inf, 1.0
        meta = {
            "algorithm": self.algorithm, **model.event, "chain": [[int(i), int(a), int(b)] for i, a, b in chain],
            "covers": covers, "events": events, "lambda": self.lam, **self.model.describe(), **flag,
            "schedule": self.schedule,
        }
        return Release(stream, step, self.name, self.model.to_value(model.w), eps, delta, meta,
                       purpose=f"model:{model.event['model_id']}", noise=declared)

    @property
    def schedule(self) -> dict[str, Any]:
        """The constructor parameters the calls' noise scales depend on besides the budget, model and
        calibration (in every release's meta: the verifier rebuilds the scales from them)."""
        return {}

    def describe(self) -> dict[str, Any]:
        if self.not_private:
            return {"algorithm": self.algorithm, "guarantee": "NONE (as-published calibration, NOT PRIVATE)",
                    "noise": NOT_PRIVATE_LAW, "not_private": True, "granularity": None}
        return {"algorithm": self.algorithm, "guarantee": self.guarantee.describe(), "noise": self.noise_law,
                "granularity": self.granularity}


def _union(ranges: list[tuple[int, int]]) -> list[list[int]]:
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out
