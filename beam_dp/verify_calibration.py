"""A release's noise declaration recomputed from public parameters, for ``beam_dp.verify``
(:class:`Calibrations` dispatches on the mechanism: sums, ERM model releases, lifelong DP-SGD, growing
databases, incremental regression, L2DP-ML).

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

A growing database's account (:class:`GrowingDbCalibrations`), an incremental regression's trees,
reruns and solver (:class:`RegressionCalibrations`) and L2DP-ML's draws (:class:`L2dpCalibrations`)
are rebuilt from the row's budget and the plan its meta states; a release written before its family
declared a parameter the rebuild needs is checked as far as its declaration goes and counted in
:meth:`Calibrations.notes`.

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

__all__ = ["Calibrations", "ERM_FAMILIES", "ErmCalibrations", "GROWING_DB_FAMILIES", "GrowingDbCalibrations",
           "L2dpCalibrations", "LIFELONG_FAMILIES", "LifelongCalibrations", "RECOMPUTED_FAMILIES",
           "REGRESSION_FAMILIES", "RegressionCalibrations", "SumCalibrations"]

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
    #: whether a release's check depends on its stream (its ``scope``): else one check serves every
    #: stream's release with the same public parameters
    scoped = False

    def __init__(self) -> None:
        self._logged: dict[Hashable, set] = {}
        self._declared: dict[Hashable, dict[tuple, int]] = {}
        self._unrecomputed: dict[tuple[str, str], int] = {}

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

    def _note(self, mechanism: str, lacking: str) -> None:
        """Count a release written before its family declared ``lacking`` (checked as far as its
        declaration goes, see :meth:`notes`)."""
        self._unrecomputed[(mechanism, lacking)] = self._unrecomputed.get((mechanism, lacking), 0) + 1

    def notes(self) -> list[str]:
        """One line per (mechanism, parameter) of the releases whose calibration was not recomputed."""
        return [f"{n} distinct {mechanism} release(s): calibration not recomputed: written before {lacking} was "
                "declared (their declaration checked as stated)" for (mechanism, lacking), n in
                sorted(self._unrecomputed.items())]

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

    n_features, clip_bound = int(meta["n_features"]), float(meta["clip_bound"])
    if meta["model"] == "softmax":
        return SoftmaxRegression(n_features=n_features, clip_bound=clip_bound, n_classes=int(meta["n_classes"]))
    if meta["model"] == "huber":
        return HuberRegression(n_features=n_features, clip_bound=clip_bound, huber=float(meta["huber"]))
    raise ValueError(f"unknown model {meta['model']!r}")


def _erm_mechanism(meta: dict, model, lam: float, epsilon: float, delta: float, tolerance: float | None,
                   granularity: float | None):
    """The release's ERM mechanism rebuilt with its own constructor from its budget, model, calibration
    (the solver tolerance and grid its calls give) and ``meta["schedule"]``."""
    from beam_dp.mechanisms.erm import ContinualReleaseMechanism, MultiResolutionMechanism, SlidingWindowMechanism

    common = dict(model=model, lam=lam, epsilon=epsilon, delta=delta, noise=meta["law"], granularity=granularity,
                  **({"calibration": "spec"} if tolerance is None else {"tolerance": tolerance}))
    schedule, algorithm = meta["schedule"], meta["algorithm"]
    if algorithm in ("multires", "multires_sampled"):
        return MultiResolutionMechanism(block=int(schedule["block"]), max_level=schedule["max_level"],
                                        sampling=algorithm == "multires_sampled", **common)
    variants: dict[str, Any] = {"continual": "cumulative", "continual_sampled": "cumulative",
                                "continual_basic": "basic", "independent_blocks": "independent"}
    if algorithm in variants:
        return ContinualReleaseMechanism(update=int(schedule["update"]), base=int(schedule["base"]),
                                         variant=variants[algorithm], sampling=algorithm == "continual_sampled",
                                         base_fraction=float(schedule["base_fraction"]), **common)
    if algorithm in ("sliding_window", "sliding_window_sampled"):
        return SlidingWindowMechanism(block=int(schedule["block"]), levels=int(schedule["levels"]),
                                      sampling=algorithm == "sliding_window_sampled", **common)
    raise ValueError(f"unknown ERM algorithm {algorithm!r}")


def _erm_call_noise(mechanism, call: dict) -> tuple[float, float]:
    """The (noise scale, sampling probability) ``mechanism``'s schedule gives the logged ``call``."""
    role = call["role"]
    if role == "level":
        return mechanism.level_noise(int(call["level"]))
    if "bucket_blocks" in call:
        return mechanism.bucket_noise(int(call["bucket_blocks"]))
    if role == "large":
        return mechanism.large_noise(int(call["j"]))
    if role == "base":
        return mechanism.base_scale(), 1.0
    if role in ("small", "block"):
        return mechanism.update_scale(), 1.0
    raise ValueError(f"unknown ERM call role {role!r}")


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
    release of the same stream logs. Every logged call's ``noise_scale`` and ``sample_p`` must be what
    the mechanism, rebuilt from the row's budget, its model, calibration and ``meta["schedule"]``
    (block sizes, levels, base fraction), gives a call of its role, and its ``n_norm`` the number of
    its members."""

    family = "ERM call"
    scoped = True
    logged_as = "training call"

    def __init__(self) -> None:
        super().__init__()
        self._mechanisms: dict[tuple, Any] = {}

    def _scale_problem(self, mechanism: str, meta: dict, model, lam: float, epsilon: float, delta: float,
                       calibration: tuple) -> str | None:
        """Why a logged call's noise is not what the rebuilt mechanism's schedule gives it (``None`` if
        every call's is)."""
        if "schedule" not in meta:
            self._note(mechanism, "schedule")
            return None
        key = (json.dumps([meta.get(k) for k in ("algorithm", "law", "schedule", "model", "n_features", "clip_bound",
                                                  "n_classes", "huber")]), lam, epsilon, delta, *calibration)
        rebuilt = self._mechanisms.get(key)
        if rebuilt is None:
            rebuilt = self._mechanisms[key] = _erm_mechanism(meta, model, lam, epsilon, delta, *calibration)
        for call in [meta, *meta.get("events", [])]:
            members = sum(int(b) - int(a) + 1 for a, b in call["members"])
            if int(call["n_norm"]) != members:
                return f"a {call['role']} call normalises by n_norm {call['n_norm']!r}, its members number {members}"
            scale, p = _erm_call_noise(rebuilt, call)
            stated = float(call["noise_scale"]), float(call.get("sample_p", 1.0))
            if not (_close(stated[0], scale) and _close(stated[1], p)):
                return (f"a {call['role']} call states noise scale {stated[0]!r} at sample_p {stated[1]!r}, the "
                        f"{mechanism}'s schedule at its budget gives {scale!r} at {p!r}")
        return None

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
        why = self._scale_problem(mechanism, meta, model, lam, epsilon, delta, (tolerance, granularity))
        if why is not None:
            return why
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
    scoped = True
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


#: the growing-database releases (``beam_dp.mechanisms.growing_db``) whose accounts are recomputed
GROWING_DB_FAMILIES = frozenset(f"{m}{suffix}" for m in ("pmwg", "bbscheduler", "bbimprover")
                                for suffix in ("", "_run", "_synthetic"))


class GrowingDbCalibrations(_Calibrations):
    """A growing-database release's account recomputed from its budget and public plan.

    Every account must carry the row's own budget (``delta``; BBScheduler and BBImprover also
    ``epsilon``) and the same fixed parameters as the stream's other releases. PMWG: ``xi_n`` must be
    ``planned_xi_n(n, ε, δ, K)`` for the plan's ``K`` (``meta["xi_n_plan"]``; ``None``: ``ξ_n`` set by
    the job, a public parameter). BBScheduler: ``gamma`` must be §3.2's for ``meta["gamma_plan"]``
    (``n``, ``β`` and the black box's ``(p, g)``; ``None``: ``γ`` set by the job), and a run's
    ``epsilon_run`` its epoch's ``ε_i``. BBImprover: the account's size ``t`` is the row's step and a
    run's ``epsilon_run`` is ``ε_t`` of the budget."""

    family = "growing-database account"
    scoped = True

    def __init__(self) -> None:
        super().__init__()
        self._fixed: dict[Hashable, tuple] = {}

    def _check(self, mechanism: str, meta: dict, terms: tuple, accounts: tuple, epsilon: float, delta: float,
               step: int, scope: Hashable) -> str | None:
        base = mechanism.removesuffix("_run").removesuffix("_synthetic")
        if terms or len(accounts) != 1 or accounts[0][0] != base:
            return f"its declaration is not a {mechanism}'s (one {base!r} account)"
        params = dict(accounts[0][1])
        budget = {"delta": delta} if base == "pmwg" else {"epsilon": epsilon, "delta": delta}
        for name, value in budget.items():
            if not _close(float(params[name]), value):
                return f"its account states {name} {params[name]!r}, its budget's is {value!r}"
        why = getattr(self, f"_{base}")(mechanism, meta, params, epsilon, delta, step)
        fixed = tuple(sorted((k, v) for k, v in params.items() if k not in ("segments", "load", "epochs", "t")))
        if why is None and self._fixed.setdefault(scope, fixed) != fixed:
            why = (f"its account's parameters {dict(fixed)} differ from its stream's other releases' "
                   f"{dict(self._fixed[scope])}")
        return why

    def _pmwg(self, mechanism: str, meta: dict, params: dict, epsilon: float, delta: float, step: int) -> str | None:
        from beam_dp.core.accounting.growing_db import planned_xi_n

        if "xi_n_plan" not in meta:
            self._note(mechanism, "xi_n_plan")
            return None
        if meta["xi_n_plan"] is None:
            return None  # ξ_n set by the job: itself the public parameter
        expected = planned_xi_n(int(params["n"]), epsilon, delta, int(meta["xi_n_plan"]))
        if not _close(float(params["xi_n"]), expected):
            return (f"it declares noise xi_n {params['xi_n']!r}, PMWG's plan of {meta['xi_n_plan']} segments at its "
                    f"budget and n={params['n']!r} gives {expected!r}")
        return None

    def _bbscheduler(self, mechanism: str, meta: dict, params: dict, epsilon: float, delta: float,
                     step: int) -> str | None:
        from beam_dp.core.accounting.growing_db import bbscheduler_plan

        gamma = float(params["gamma"])
        plan = meta.get("gamma_plan")
        if "gamma_plan" not in meta:
            self._note(mechanism, "gamma_plan")  # its runs' ε_i are still recomputed from the declared γ
        elif plan is not None:
            expected = bbscheduler_plan(n=int(plan["n"]), epsilon=epsilon, beta=float(plan["beta"]), delta=delta,
                                        p=float(plan["p"]), g=float(plan["g"])).gamma
            if not _close(gamma, expected):
                return f"it declares gamma {gamma!r}, the schedule of its budget and plan {plan} has {expected!r}"
        if mechanism.endswith("_run"):
            run = int(meta["run"])
            # ε_i depends on (ε, δ, γ) only: n and β are placeholders here
            expected = bbscheduler_plan(n=1, epsilon=epsilon, beta=math.exp(-1.0), delta=delta, gamma=gamma
                                        ).epsilon_i(run)
            if float(params["epochs"]) != run + 1 or not _close(float(meta["epsilon_run"]), expected):
                return (f"run {run} states epsilon_run {meta['epsilon_run']!r} after {params['epochs']!r} epochs, "
                        f"epoch {run} of its budget and gamma runs at {expected!r}")
        return None

    def _bbimprover(self, mechanism: str, meta: dict, params: dict, epsilon: float, delta: float,
                    step: int) -> str | None:
        from beam_dp.core.accounting.growing_db import bbimprover_epsilon, cdp_budget_sq

        if float(params["t"]) != step:
            return f"its account is charged at size t {params['t']!r}, the release is at step {step}"
        if mechanism.endswith("_run"):
            expected = float(bbimprover_epsilon(int(meta["run"]), int(params["n"]), cdp_budget_sq(epsilon, delta)))
            if not _close(float(meta["epsilon_run"]), expected):
                return (f"run {meta['run']} states epsilon_run {meta['epsilon_run']!r}, epsilon_t of its budget "
                        f"and n={params['n']!r} is {expected!r}")
        return None


#: the incremental regressions (``beam_dp.mechanisms.online.regression``) rebuilt from their meta
REGRESSION_FAMILIES = frozenset({"privincreg1", "privincreg2", "privincerm"})


class RegressionCalibrations(_Calibrations):
    """An incremental regression's declaration rebuilt from its budget and meta.

    PRIVINCREG₁/₂: two Gaussian trees at ``(ε/2, δ/2)``, ``Δ₂ = 2``, of the meta's ``horizon``,
    ``unbounded`` and ``calibration`` (``make_tree_sum``); the row must declare both trees' worst loss at
    its step. PRIVINCERM: ``ceil(horizon/tau)`` calls at ``ε′ = ε/(2√(2k ln(2/δ)))``, ``δ′ = δ/(2k)``
    (the meta's ``epsilon_call``/``delta_call`` must be these), ``step // tau`` calls so far, declared
    as Thm A.4 (``δ* = δ/2``) or, for the default solver, its ``calls·iterations`` Gaussian iterations
    at sensitivity ``2·lipschitz`` and ``NoisyGradientDescent.sigma(ε′, δ′)``."""

    family = "incremental regression"

    def __init__(self) -> None:
        super().__init__()
        self._trees: dict[tuple, Any] = {}  # one tree per public parameter set (its calibration runs once)
        self._declarations: dict[tuple, str] = {}  # per parameter set and step

    def _check(self, mechanism: str, meta: dict, terms: tuple, accounts: tuple, epsilon: float, delta: float,
               step: int, scope: Hashable) -> str | None:
        if mechanism == "privincerm":
            return self._erm(mechanism, meta, terms, accounts, epsilon, delta, step)
        from beam_dp.core.noise_declaration import combined_declaration
        from beam_dp.mechanisms.sums.tree import make_tree_sum

        if not all(k in meta for k in ("horizon", "unbounded", "calibration")):
            self._note(mechanism, "horizon, unbounded and calibration")
            return None
        key = (meta["horizon"], meta["unbounded"], meta["calibration"], epsilon, delta)
        if key not in self._trees:
            self._trees[key] = make_tree_sum(dim=1, horizon=meta["horizon"], unbounded=meta["unbounded"],
                                             epsilon=epsilon / 2.0, delta=delta / 2.0, sensitivity=2.0,
                                             noise="gaussian", calibration=meta["calibration"])
        at = key + (step,)
        if at not in self._declarations:
            one = self._trees[key]._worst_loss(step).declaration()  # what either tree's release declares
            self._declarations[at] = combined_declaration(one, one)
        expected, _ = declared_terms(self._declarations[at])
        if accounts or not _same_terms(terms, expected):
            return (f"it declares {sorted(terms)}, the two trees of its budget and meta declare {sorted(expected)} "
                    f"at step {step}")
        return None

    def _erm(self, mechanism: str, meta: dict, terms: tuple, accounts: tuple, epsilon: float, delta: float,
             step: int) -> str | None:
        from beam_dp.mechanisms.online.convex_sets import L2Ball
        from beam_dp.mechanisms.online.regression import NoisyGradientDescent

        if not all(k in meta for k in ("tau", "horizon", "calls", "epsilon_call", "delta_call")):
            self._note(mechanism, "tau, horizon and calls")
            return None
        tau, horizon = int(meta["tau"]), int(meta["horizon"])
        planned = math.ceil(horizon / tau)
        eps_call = epsilon / (2.0 * math.sqrt(2.0 * planned * math.log(2.0 / delta)))
        delta_call = delta / (2.0 * planned)
        calls = step // tau
        if not (_close(float(meta["epsilon_call"]), eps_call) and _close(float(meta["delta_call"]), delta_call)):
            return (f"it states per-call (epsilon, delta) ({meta['epsilon_call']!r}, {meta['delta_call']!r}), "
                    f"{planned} calls of its budget get ({eps_call!r}, {delta_call!r})")
        if int(meta["calls"]) != calls:
            return f"it states {meta['calls']!r} solver calls, a rerun every {tau} steps makes {calls} by step {step}"
        if accounts:
            a4 = {"k": float(calls), "epsilon": eps_call, "delta": delta_call, "delta_star": delta / 2.0}
            if terms or len(accounts) != 1 or accounts[0][0] != "advanced_composition" or not all(
                    _close(float(dict(accounts[0][1])[k]), v) for k, v in a4.items()):
                return f"it declares {list(accounts)}, Thm A.4 of its budget and schedule is {a4}"
            return None
        if not all(k in meta for k in ("lipschitz", "iterations")):
            self._note(mechanism, "lipschitz and iterations")
            return None
        # the loss depends on the Lipschitz bound and iteration count only: any constraint set will do
        solver = NoisyGradientDescent(L2Ball(1), float(meta["lipschitz"]), int(meta["iterations"]))
        expected, _ = declared_terms(solver.loss(calls, eps_call, delta_call).declaration())
        if not _same_terms(terms, expected):
            return (f"it declares {sorted(terms)}, the default solver's {calls} call(s) at its budget and schedule "
                    f"declare {sorted(expected)}")
        return None


class L2dpCalibrations(_Calibrations):
    """An L2DP-ML release's ``l2dp_ml`` account rebuilt from its budget and meta: ``Δ_R = d(β + 2)``,
    ``Δ_L = 2(n_π + 1)`` of the meta's ``input_dim``, ``hidden`` and ``last_hidden``, the split
    ``l2dp_budget(ε, rho_s, batch_size, b_theta)``, and the draws' scales ``Δ_R/ε_1`` (χ_1, χ_2) and
    ``Δ_L/ε_2`` (χ_3)."""

    family = "L2DP-ML account"

    def _check(self, mechanism: str, meta: dict, terms: tuple, accounts: tuple, epsilon: float, delta: float,
               step: int, scope: Hashable) -> str | None:
        from beam_dp.core.accounting.lifelong import l2dp_budget, sensitivity_label, sensitivity_reconstruction

        if terms or len(accounts) != 1 or accounts[0][0] != "l2dp_ml":
            return f"its declaration is not a {mechanism}'s (one 'l2dp_ml' account)"
        if not all(k in meta for k in ("rho_s", "input_dim", "hidden", "last_hidden")):
            self._note(mechanism, "rho_s, input_dim, hidden and last_hidden")
            return None
        params = dict(accounts[0][1])
        delta_r = sensitivity_reconstruction(int(meta["input_dim"]), int(meta["hidden"]))
        delta_l = sensitivity_label(int(meta["last_hidden"]))
        split = l2dp_budget(epsilon, float(meta["rho_s"]), int(params["batch_size"]), float(params["b_theta"]),
                            delta_r, delta_l)
        expected = {"delta_r": delta_r, "delta_l": delta_l, "scale_chi1": delta_r / split.epsilon_1,
                    "scale_chi2": delta_r / split.epsilon_1, "scale_chi3": delta_l / split.epsilon_2}
        wrong = [k for k, v in expected.items() if not _close(float(params[k]), v)]
        if wrong:
            return (f"it declares {', '.join(f'{k} {params[k]!r}' for k in wrong)}; the split of its budget and "
                    f"meta gives {', '.join(f'{k} {expected[k]!r}' for k in wrong)}")
        return None


class Calibrations:
    """The family checks of :data:`RECOMPUTED_FAMILIES`, dispatched on a release's mechanism name."""

    def __init__(self) -> None:
        sums, erm, lifelong = SumCalibrations(), ErmCalibrations(), LifelongCalibrations()
        growing, regression = GrowingDbCalibrations(), RegressionCalibrations()
        self._checks: dict[str, _Calibrations] = {**{name: sums for name in _BUILDERS},
                                                  **{name: erm for name in ERM_FAMILIES},
                                                  **{name: lifelong for name in LIFELONG_FAMILIES},
                                                  **{name: growing for name in GROWING_DB_FAMILIES},
                                                  **{name: regression for name in REGRESSION_FAMILIES},
                                                  "l2dp_ml": L2dpCalibrations()}

    def problem(self, mechanism: str, meta_text: str, epsilon: float, delta: float, step: int,
                declaration: str, scope: Hashable = None) -> str | None:
        """:meth:`_Calibrations.problem` of ``mechanism``'s family (one of :data:`RECOMPUTED_FAMILIES`)."""
        return self._checks[mechanism].problem(mechanism, meta_text, epsilon, delta, step, declaration, scope)

    def scoped(self, mechanism: str) -> bool:
        """Whether ``mechanism``'s check compares a stream's releases with each other (its scope matters)."""
        return self._checks[mechanism].scoped

    def unmatched(self) -> list[str]:
        """Every family's problems found once all releases were seen."""
        return [line for check in dict.fromkeys(self._checks.values()) for line in check.unmatched()]

    def notes(self) -> list[str]:
        """Every family's releases written before a parameter its recompute needs was declared."""
        return [line for check in dict.fromkeys(self._checks.values()) for line in check.notes()]


#: the mechanisms whose declarations are recomputed from public parameters
RECOMPUTED_FAMILIES = (frozenset(_BUILDERS) | ERM_FAMILIES | LIFELONG_FAMILIES | GROWING_DB_FAMILIES
                       | REGRESSION_FAMILIES | {"l2dp_ml"})
