"""A release's noise declaration recomputed from public parameters, for ``beam_dp.verify``
(:class:`Calibrations` dispatches on the mechanism: sums, ERM model releases, lifelong DP-SGD).

A release of a continual sum (the trees, the window tree, BLT, Toeplitz) carries its calibration's
public parameters: the mechanism's name, its ``meta`` (horizon, fit, levels, window, noise law,
calibration), its ``epsilon_budget``/``delta_budget`` and, in its noise declaration, the L2
sensitivity ``Δ₂`` of its nodes. :class:`SumCalibrations` rebuilds the mechanism from these with the
mechanism's own constructor (so its own calibration: Gamma scale, analytic or paper sigma, the
fitted k-ary tree or BLT) and asks it for the worst-hit element's loss after the row's step
(``_worst_loss(step)``, what the mechanism itself declared). The row's declaration must be that one:
the same laws, sensitivities, scales and weights (node counts or squared column norms). A declaration
emptied, reweighted or rescaled by hand, a budget or step that does not fit it, and parameters the
mechanism cannot be built from all fail.

The sensitivity itself is not a public parameter of a sum (``R`` is not in every row's meta): it is
taken from the declaration, and the scales must then match it, so a declaration cannot lower its
loss by changing ``Δ₂`` either.

An ERM release's sensitivities are recomputed from its meta (:class:`ErmCalibrations`), and a
lifelong learner's DP-SGD accounts matched with the parameters its releases report
(:class:`LifelongCalibrations`); both also require every key a release declares to be one that a
release of the same (domain, stream) logs (:meth:`Calibrations.unmatched`, once every row was seen).
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Hashable, Iterable

from beam_dp.core.noise_declaration import declared_terms

__all__ = ["Calibrations", "ERM_FAMILIES", "ErmCalibrations", "LIFELONG_FAMILIES", "LifelongCalibrations",
           "RECOMPUTED_FAMILIES", "SumCalibrations"]

_REL_TOL = 1e-9  # the same arithmetic on the same public numbers: only float rounding differs


def _gaussian_calibration(meta: dict) -> dict:
    """The ``calibration`` argument of a Gaussian tree (Gamma nodes are always exact)."""
    return {"calibration": meta["calibration"]} if meta.get("noise") == "gaussian" else {}


def _kary(meta: dict, common: dict):
    from beam_dp.mechanisms.sums.pure import KaryTreeSum

    return KaryTreeSum(horizon=meta["fit_horizon"], **common), {"arity": "arity", "levels": "levels"}


def _honaker(meta: dict, common: dict):
    from beam_dp.mechanisms.sums.honaker import HonakerTreeSum

    return HonakerTreeSum(arity=int(meta["arity"]), levels=int(meta["levels"]), **common), {}


def _binary(meta: dict, common: dict):
    from beam_dp.mechanisms.sums.tree import BinaryTreeSum

    return BinaryTreeSum(horizon=int(meta["horizon"]), **common, **_gaussian_calibration(meta)), {}


def _hybrid(meta: dict, common: dict):
    from beam_dp.mechanisms.sums.tree import HybridTreeSum

    return HybridTreeSum(**common, **_gaussian_calibration(meta)), {}


def _doubling(meta: dict, common: dict):
    from beam_dp.mechanisms.sums.tree import DoublingTreeSum

    return DoublingTreeSum(**common, **_gaussian_calibration(meta)), {}


def _window(meta: dict, common: dict):
    from beam_dp.mechanisms.sums.window_tree import WindowTreeSum

    mechanism = WindowTreeSum(window=int(meta["window_requested"]), **common, **_gaussian_calibration(meta))
    return mechanism, {"levels": "levels", "window": "block"}


def _blt(meta: dict, common: dict):
    from beam_dp.mechanisms.sums.blt import BLTSum

    horizon = meta["horizon"]
    error = meta.get("fit_error", "max")  # the fit's objective (releases without the field: the max-error fit)
    mechanism = BLTSum(horizon=None if horizon is None else int(horizon), error=error, **common)
    return mechanism, {"fit_horizon": "fit_horizon"}


def _toeplitz(meta: dict, common: dict):
    from beam_dp.mechanisms.sums.toeplitz import ToeplitzSqrtSum

    return ToeplitzSqrtSum(horizon=int(meta["horizon"]), **common), {}


#: mechanism -> (the meta fields its construction reads, its builder from (meta, common constructor
#: arguments), which returns the mechanism and the meta fields that must equal its attributes)
_BUILDERS: dict[str, tuple[tuple[str, ...], Callable[[dict, dict], tuple[Any, dict[str, str]]]]] = {
    "kary_tree": (("fit_horizon",), _kary),
    "honaker_tree": (("arity", "levels"), _honaker),
    "binary_tree": (("horizon", "calibration"), _binary),
    "hybrid_tree": (("calibration",), _hybrid),
    "doubling_tree": (("calibration",), _doubling),
    "window_tree": (("window_requested", "calibration"), _window),
    "blt": (("horizon", "fit_error"), _blt),
    "toeplitz_sqrt": (("horizon",), _toeplitz),
}


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_REL_TOL, abs_tol=0.0)


def _same_terms(declared: tuple, expected: tuple) -> bool:
    if len(declared) != len(expected):
        return False
    return all(law == law_e and _close(s, s_e) and _close(c, c_e) and _close(w, w_e)
               for (law, s, c, w), (law_e, s_e, c_e, w_e) in zip(sorted(declared), sorted(expected)))


class _Calibrations:
    """The row-dispatch of a family's check: parse a release's public parameters, hand them to
    :meth:`_check`, and turn a parameter set the family cannot read into a reason."""

    family = "mechanism"
    #: what a declared key is checked against, for :meth:`unmatched`'s lines
    logged_as = "call"

    def __init__(self) -> None:
        self._logged: dict[Hashable, set] = {}
        self._declared: dict[Hashable, dict[tuple, int]] = {}

    def problem(self, mechanism: str, meta_text: str, epsilon: float, delta: float, step: int,
                declaration: str, scope: Hashable = None) -> str | None:
        """Why a release of ``mechanism`` at ``step`` with ``meta_text``, budget ``(epsilon, delta)``
        and noise ``declaration`` does not declare what its mechanism's own calibration gives from
        those public parameters; ``None`` when it does. ``scope`` names the release's (domain,
        stream), for the checks that compare a stream's releases with each other."""
        try:
            meta = json.loads(meta_text) if meta_text else {}
            terms, accounts = declared_terms(declaration)
            return self._check(mechanism, meta, terms, accounts, float(epsilon), float(delta), int(step), scope)
        except (KeyError, TypeError, ValueError, ArithmeticError) as exc:
            return f"its public parameters do not rebuild a {mechanism} ({type(exc).__name__}: {exc})"

    def _check(self, mechanism: str, meta: dict, terms: tuple, accounts: tuple, epsilon: float, delta: float,
               step: int, scope: Hashable) -> str | None:
        raise NotImplementedError

    def _log(self, scope: Hashable, keys: Iterable[tuple]) -> None:
        """Keys a release of ``scope`` reports in its meta (the calls or accounts it ran)."""
        self._logged.setdefault(scope, set()).update(keys)

    def _declare(self, scope: Hashable, keys: Iterable[tuple], step: int) -> None:
        """Keys a release of ``scope`` declares at ``step``: each must be one some release logs."""
        declared = self._declared.setdefault(scope, {})
        for key in keys:
            declared.setdefault(key, step)

    def unmatched(self) -> list[str]:
        """Problems found once every release was seen: a declared key that no release of its (domain,
        stream) logs (one line per stream)."""
        lines = []
        for scope, declared in self._declared.items():
            missing = sorted((step, key) for key, step in declared.items() if key not in self._logged.get(scope, ()))
            if missing:
                step, key = missing[0]
                lines.append(f"{len(missing)} declared {self.family} key(s) of {scope!r} are no {self.logged_as} its "
                             f"releases' meta reports, e.g. {key!r} declared at step {step}")
        return lines


class SumCalibrations(_Calibrations):
    """The mechanisms rebuilt so far (one per distinct public parameter set of a job) and the
    verdict on each (mechanism, meta, budget, step, declaration) checked."""

    def __init__(self) -> None:
        super().__init__()
        self._mechanisms: dict[tuple, Any] = {}

    def _check(self, mechanism: str, meta: dict, terms: tuple, accounts: tuple, epsilon: float, delta: float,
               step: int, scope: Hashable) -> str | None:
        if accounts or not terms:
            return f"its declaration is not a {mechanism}'s (accounts, or no terms)"
        sensitivities = {s for _, s, _, _ in terms}
        if len(sensitivities) != 1:
            return (f"its declaration's terms state {len(sensitivities)} sensitivities; a {mechanism}'s nodes "
                    "share one")
        sensitivity = sensitivities.pop()
        reads, build = _BUILDERS[mechanism]
        key = (mechanism, meta.get("noise"), *(json.dumps(meta.get(k)) for k in reads), epsilon, delta, sensitivity)
        built = self._mechanisms.get(key)
        if built is None:
            common = {"dim": 1, "epsilon": epsilon, "delta": delta, "sensitivity": sensitivity, "noise": meta["noise"]}
            built = self._mechanisms[key] = build(meta, common)
        rebuilt, fields = built
        for name, attribute in fields.items():
            if meta.get(name) != getattr(rebuilt, attribute):
                return (f"its meta says {name} {meta.get(name)!r}, the {mechanism} of its budget and parameters "
                        f"has {getattr(rebuilt, attribute)!r}")
        expected = rebuilt._worst_loss(step) if hasattr(rebuilt, "_worst_loss") else rebuilt.worst_loss(step)
        expected_terms, _ = declared_terms(expected.declaration())
        if not _same_terms(terms, expected_terms):
            return (f"it declares {sorted(terms)}, the {mechanism} of its budget and parameters declares "
                    f"{sorted(expected_terms)} at step {step}")
        return None


#: the ERM model releases (``beam_dp.mechanisms.erm``) whose sensitivities are recomputed
ERM_FAMILIES = frozenset({"erm_multires", "multires_sampled", "erm_continual", "erm_sliding_window"})


def _erm_model(meta: dict):
    """The release's model, rebuilt from the constants its meta states (``LinearModel.describe``)."""
    from beam_dp.mechanisms.erm.models import HuberRegression, SoftmaxRegression

    common = {"n_features": int(meta["n_features"]), "clip_bound": float(meta["clip_bound"])}
    if meta["model"] == "softmax":
        return SoftmaxRegression(n_classes=int(meta["n_classes"]), **common)
    if meta["model"] == "huber":
        return HuberRegression(huber=float(meta["huber"]), **common)
    raise ValueError(f"unknown model {meta['model']!r}")


def _positions(meta: dict) -> int:
    """The last stream position the release's model and chain were trained on: no call of the stream
    so far normalises by more rows than that."""
    ends = [int(b) for a, b in meta["members"]] + [int(b) for _, _, b in meta.get("chain", [])]
    ends += [int(b) for _, b in meta.get("covers", [])]
    return max(ends)


def _erm_key(sensitivity: float, scale: float, p: float) -> tuple[float, float, float]:
    """A call's noise key ``(Δ, scale, sample_p)``; a mechanism computes a key's floats by the same
    arithmetic every time (``erm.declaration.count_charge``), so keys compare exactly."""
    return float(sensitivity), float(scale), float(p)


class ErmCalibrations(_Calibrations):
    """An ERM release's calls recomputed from its public meta: the model constants, ``lambda``, and
    each logged call's ``n_norm``, ``solver_target`` and ``sensitivity_slack``.

    Every call the release logs (its own and those in ``events``): its ``sensitivity`` must be
    ``call_sensitivity(model, λ, n_norm, τ, g)`` with the tolerance ``τ = solver_target·n_norm/L``
    of a certified call (``None``, the spec's ``2L/(λn)``, where the slack is 1; releases without the
    field are spec-calibrated) and a grid ``g`` that is 0 or a power of two, and its ``epsilon``
    (pure) or ``mu`` (Gaussian) its key's cost. Every declared term and ``erm_sampled_k_norm``
    account: its sensitivity must be that function at a whole ``n`` no larger than the positions the
    release's chain covers, and (:meth:`unmatched`) its key ``(Δ, scale, p)`` the key of a call some
    release of the same stream logs. Scales are not recomputed from the budget: they depend on the
    schedule (block sizes, levels, fractions), which a release's meta does not carry."""

    family = "ERM call"
    logged_as = "training call"

    def _call_problem(self, mechanism: str, model, lam: float, call: dict) -> tuple[str | None, tuple, float]:
        """Why one logged ``call`` (an event) is not a call of ``mechanism`` at ``model`` and ``lam``
        (``None`` when it is); the (tolerance, grid) its fields give; its recomputed sensitivity."""
        from beam_dp.core.accounting.erm import sampled_k_norm_loss
        from beam_dp.mechanisms.erm import call_sensitivity
        from beam_dp.mechanisms.erm.solver import certified_slack

        n = int(call["n_norm"])
        slack = float(call.get("sensitivity_slack", 1.0))
        tolerance = None if slack == 1.0 else float(call["solver_target"]) * n / model.lipschitz
        base = call_sensitivity(model, lam, n, tolerance)
        stated = float(call.get("sensitivity", base))
        grid = (stated - base) / math.sqrt(model.dim)  # √d·g of a snapped release: g a power of two
        granularity = 2.0 ** round(math.log2(grid)) if grid > _REL_TOL * stated else None
        own = call_sensitivity(model, lam, n, tolerance, granularity)
        scale, p = float(call["noise_scale"]), float(call.get("sample_p", 1.0))
        if not _close(slack, 1.0 if tolerance is None else certified_slack(tolerance, n)):
            why = f"a call's sensitivity_slack {slack!r} is not its solver target's"
        elif not _close(stated, own):
            why = f"a call states sensitivity {stated!r}, the {mechanism}'s Δ(n_norm={n}) at its λ and model is {own!r}"
        elif call["law"] == "gamma" and not _close(float(call["epsilon"]), sampled_k_norm_loss(
                sensitivity=own, scale=scale, p=p)[0]):
            why = f"a call states epsilon {call['epsilon']!r}, its key costs another"
        elif call["law"] == "gaussian" and not _close(float(call["mu"]), own / scale):
            why = f"a call states mu {call['mu']!r}, its Δ/σ is {own / scale!r}"
        else:
            why = None
        return why, (tolerance, granularity), own

    def _check(self, mechanism: str, meta: dict, terms: tuple, accounts: tuple, epsilon: float, delta: float,
               step: int, scope: Hashable) -> str | None:
        from beam_dp.mechanisms.erm import call_sensitivity
        from beam_dp.mechanisms.erm.declaration import SAMPLED_K_NORM

        if meta.get("not_private") or not (terms or accounts):
            return None  # no declaration to recompute: the spend checks fail such a release
        model, lam = _erm_model(meta), float(meta["lambda"])
        _, (tolerance, granularity), _ = self._call_problem(mechanism, model, lam, meta)
        logged = []
        for call in [meta, *meta.get("events", [])]:
            why, calibration, own = self._call_problem(mechanism, model, lam, call)
            if why is not None or not all(a == b or (a is not None and b is not None and _close(a, b))
                                          for a, b in zip(calibration, (tolerance, granularity))):
                return why or "its logged calls differ in solver tolerance or grid from its own"
            logged.append(_erm_key(own if "sensitivity" not in call else call["sensitivity"], call["noise_scale"],
                                   call.get("sample_p", 1.0)))
        self._log(scope, logged)
        keys = [_erm_key(s, c, 1.0) for _, s, c, _ in terms]
        for kind, params in accounts:
            if kind != SAMPLED_K_NORM:
                return f"its declaration holds a {kind!r} account; an {mechanism} declares only {SAMPLED_K_NORM!r}"
            values = dict(params)
            keys.append(_erm_key(values["sensitivity"], values["scale"], values["p"]))
        limit = _positions(meta)
        for sensitivity, _, _ in keys:
            if _erm_normaliser(sensitivity, limit, lambda m: call_sensitivity(model, lam, m, tolerance,
                                                                              granularity)) is None:
                return (f"it declares a call of sensitivity {sensitivity!r}, which is no Δ(n) of its model, λ and "
                        f"calibration for a whole 1 <= n <= {limit}")
        self._declare(scope, keys, step)
        return None


def _erm_normaliser(sensitivity: float, limit: int, delta_of: Callable[[int], float]) -> int | None:
    """The whole ``1 <= n <= limit`` with ``delta_of(n) == sensitivity`` (to rounding); ``None`` when
    there is none. ``delta_of`` decreases in ``n`` (``(1 + s(n))·L/(λn) + √d·g``): bisection."""
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi) // 2
        if delta_of(mid) > sensitivity * (1 + _REL_TOL):
            lo = mid + 1
        else:
            hi = mid
    return lo if _close(delta_of(lo), sensitivity) else None


#: the lifelong learners whose DP-SGD accounts are matched with what their releases' meta reports
LIFELONG_FAMILIES = frozenset({"naive_gaussian", "dpsgd_agem_bounded"})
_DPSGD_KINDS = ("dpsgd", "dpsgd_pld")


def _dpsgd_key(sampling_rate: float, noise_multiplier: float, steps: float) -> tuple[float, float, float]:
    """A DP-SGD stream's key ``(q, z, steps)``: the meta and the account carry the same floats."""
    return float(sampling_rate), float(noise_multiplier), float(steps)


class LifelongCalibrations(_Calibrations):
    """A lifelong learner's DP-SGD accounts matched with the parameters its releases' meta reports.

    A release whose meta states its task's ``sampling_rate``, ``noise_multiplier`` and ``steps`` logs
    that task stream's key ``(q, z, steps)`` (and, with ``memory_sampling_rate``, its memory stream's
    ``(1/B, noise_multiplier_memory, steps)``); every ``dpsgd``/``dpsgd_pld`` account a release
    declares must carry the key of a task some release of the stream reported (:meth:`unmatched`),
    and a bounded learner's account its ``noise_multiplier_memory`` and ``memory_uses_cap``. The
    multipliers themselves are calibrated by the accountant at the learner's budget and schedule, which
    the meta does not carry in full (the number of tasks, per-task sizes): they are matched, not
    recomputed. Rows whose meta states none of these parameters are checked as far as their
    declaration goes."""

    family = "DP-SGD account"
    logged_as = "task stream"

    def _check(self, mechanism: str, meta: dict, terms: tuple, accounts: tuple, epsilon: float, delta: float,
               step: int, scope: Hashable) -> str | None:
        if terms or any(kind not in _DPSGD_KINDS for kind, _ in accounts):
            return f"its declaration is not a {mechanism}'s (terms, or accounts other than {_DPSGD_KINDS})"
        if meta.get("noise_multiplier") is None or "sampling_rate" not in meta or "steps" not in meta:
            return None  # the meta reports no task stream: nothing to match
        reported = [_dpsgd_key(meta["sampling_rate"], meta["noise_multiplier"], meta["steps"])]
        if meta.get("memory_sampling_rate") is not None and meta.get("noise_multiplier_memory") is not None:
            reported.append(_dpsgd_key(meta["memory_sampling_rate"], meta["noise_multiplier_memory"], meta["steps"]))
        self._log(scope, reported)
        declared = [dict(params) for _, params in accounts]
        for params in declared:
            for field, stated in (("memory_noise_multiplier", "noise_multiplier_memory"),
                                  ("memory_uses", "memory_uses_cap")):
                if field in params and meta.get(stated) is not None and not _close(params[field], float(meta[stated])):
                    return f"it declares {field} {params[field]!r}, its meta reports {stated} {meta[stated]!r}"
        self._declare(scope, [_dpsgd_key(p["sampling_rate"], p["noise_multiplier"], p["steps"]) for p in declared],
                      step)
        return None


class Calibrations:
    """The family checks of :data:`RECOMPUTED_FAMILIES`, dispatched on a release's mechanism name."""

    def __init__(self) -> None:
        sums, erm, lifelong = SumCalibrations(), ErmCalibrations(), LifelongCalibrations()
        self._checks: dict[str, _Calibrations] = {**{name: sums for name in _BUILDERS},
                                                  **{name: erm for name in ERM_FAMILIES},
                                                  **{name: lifelong for name in LIFELONG_FAMILIES}}

    def problem(self, mechanism: str, meta_text: str, epsilon: float, delta: float, step: int,
                declaration: str, scope: Hashable = None) -> str | None:
        """:meth:`_Calibrations.problem` of ``mechanism``'s family (one of :data:`RECOMPUTED_FAMILIES`)."""
        return self._checks[mechanism].problem(mechanism, meta_text, epsilon, delta, step, declaration, scope)

    def unmatched(self) -> list[str]:
        """Every family's problems found once all releases were seen."""
        return [line for check in dict.fromkeys(self._checks.values()) for line in check.unmatched()]


#: the mechanisms whose declarations are recomputed from public parameters
RECOMPUTED_FAMILIES = frozenset(_BUILDERS) | ERM_FAMILIES | LIFELONG_FAMILIES
