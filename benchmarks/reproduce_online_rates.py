"""Rates for the online-learning and incremental-regression papers (issue 17): fitted log-log slopes.

Lou & Cheung, "Projection-free Online ERM with Privacy-preserving and Privacy Expiration" (WDP-COCOL,
Theorems 6-7) and Kasiviswanathan, Nissim & Jin, "Private Incremental Regression" (PRIVINCREG1,
Theorem 4.2; PRIVINCREG2, Theorem 5.7). Parts (each alone with its flag, all by default)::

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python benchmarks/reproduce_online_rates.py --out /tmp/rates

* ``--cocol``: WDP-COCOL regret (private minus non-private on the same data) against d and against ε.
* ``--reg-d``: PRIVINCREG1 excess empirical risk against d (theory: O(√d), slope 1/2 against d).
* ``--reg2-rate``: PRIVINCREG2 excess against T^{1/3} W^{2/3} (theory slope 1), m from the paper's
  formula with a small constant ``c_m`` so that m ≪ d.
* ``--regime``: PRIVINCREG1 against PRIVINCREG2 (m ≪ d) and θ = 0 at large d, each also run without
  noise (the test-only ``ZeroNoise``, same schedules) to split its excess into the solver/projection
  part and the privacy-noise part.

``--smoke`` shrinks every part to seconds (used by the tests). Writes ``rates.json``, ``rates.md``
and, unless ``--no-figures``, ``online_rates_cocol.png`` and ``online_rates_regression.png`` into
``--out``. Slopes: least squares on log-log means over seeds; the interval is the mean ± t-quantile
(95%) × standard error of the per-seed slopes.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_online_regression import KEY, ls_min, quadratic, regret_curve, signal_data  # noqa: E402

from beam_dp.core import NoiseSource  # noqa: E402
from beam_dp.mechanisms.online.convex_sets import L1Ball, L2Ball, Simplex  # noqa: E402
from beam_dp.mechanisms.online.learners import WDPCOCOL  # noqa: E402
from beam_dp.mechanisms.online.regression import make_incremental_regression  # noqa: E402
from beam_dp.testing.noise import ZeroNoise  # noqa: E402


def slope_ci(x, per_seed):
    """Slope of log(mean over seeds) against log(x), and the 95% t-interval of the per-seed slopes
    (seeds with a non-positive value are left out of the interval; their count is returned)."""
    x = np.asarray(x, dtype=float)
    Y = np.asarray(per_seed, dtype=float)  # (seeds, points)
    mean = Y.mean(axis=0)
    slope = float(np.polyfit(np.log(x), np.log(mean), 1)[0]) if np.all(mean > 0) else float("nan")
    ok = [row for row in Y if np.all(row > 0)]
    slopes = [float(np.polyfit(np.log(x), np.log(row), 1)[0]) for row in ok]
    if len(slopes) >= 2:
        half = float(stats.t.ppf(0.975, len(slopes) - 1) * np.std(slopes, ddof=1) / math.sqrt(len(slopes)))
    else:
        half = float("nan")
    return {"slope": slope, "ci95": half, "seed_slopes": slopes, "seeds_left_out": len(Y) - len(ok)}


# ---------------------------------------------------------------------------------------------
# WDP-COCOL regret against d and ε
# ---------------------------------------------------------------------------------------------
def cocol_data(T, d, seed):
    """``z_t = p + N(0, 0.2² I_d)`` around ``p = (0.6, 0.4, 0, …)`` (part 1's COCOL data for d = 2)."""
    p = np.zeros(d)
    p[0], p[1] = 0.6, 0.4
    return p + 0.2 * np.random.default_rng(seed).standard_normal((T, d))


def cocol_regret(d, eps, noise_law, T, seed, private, constants):
    mech = WDPCOCOL(dim=d, constraint=Simplex(d), loss=quadratic(1.0, 2.0), epsilon=eps,
                    delta=1e-5 if noise_law == "gaussian" else 0.0, noise=noise_law, window=16,
                    calibration="paper", **constants)  # as published in docs/online.md §0
    noise = NoiseSource(KEY) if private else ZeroNoise()
    reg, _ = regret_curve(mech, cocol_data(T, d, seed), noise, f"cocol-d{d}-e{eps}-s{seed}", [T])
    return float(reg[0])


def part_cocol(args, res):
    """f_t = ½‖x − z_t‖² on the simplex, L = 2, μ = 1, W = 16. The paper's C_0 = (25ρ²)² = 625 d² makes
    T ≫ C_0 unaffordable beyond d = 2, so the d sweep overrides α = 0.1 and C_0 = 20 for every d
    (privacy-neutral; releases say ``paper_constants = False``); C_W and C_1 keep the paper's
    formulas. The ε sweep runs at d = 5 with the same override and at d = 2 with the paper's constants."""
    T, seeds = args.cocol_T, range(args.seeds)
    over = {"alpha": 0.1, "C0": 20.0}
    sweeps = {"d-gamma": ("d", "gamma", over, T, [(d, 4.0) for d in args.cocol_dims]),
              "d-gaussian": ("d", "gaussian", over, T, [(d, 1.0) for d in args.cocol_dims]),
              "eps": ("eps", "gamma", over, T, [(5, e) for e in args.cocol_eps]),
              "eps-paper": ("eps", "gamma", {}, args.cocol_paper_T, [(2, e) for e in args.cocol_paper_eps])}
    out = []
    for name in args.cocol_sweeps:
        axis, law, constants, T, points = sweeps[name]
        rows = []
        for d, eps in points:
            regs = [cocol_regret(d, eps, law, T, s, True, constants) for s in seeds]
            base = [cocol_regret(d, eps, law, T, s, False, constants) for s in seeds]
            rows.append({"d": d, "epsilon": eps, "regret": regs, "non_private": base,
                         "excess": [r - b for r, b in zip(regs, base)]})
            print(f"[cocol] {law} {'paper' if not constants else 'C0=20'} d={d} ε={eps:g}: regret "
                  f"{np.mean(regs):.2f} (non-private {np.mean(base):.2f})", flush=True)
        x = [r[axis if axis == "d" else "epsilon"] for r in rows]
        # with the paper's constants the ε enters the schedule (C_W ∝ 1/ε in r_t), so the noise-free run
        # moves with ε too: the total private regret is the theorem's quantity there
        fitted = "regret" if not constants else "excess"
        fit = slope_ci(x, np.array([r[fitted] for r in rows]).T)
        theory = {"d": 1.0 if law == "gamma" else 0.5, "eps": -1.0}[axis]
        out.append({"sweep": name, "fitted": fitted, "axis": axis, "noise": law, "paper_constants": not constants,
                    "T": T, "rows": rows,
                    "fit": fit, "theory": theory})
        print(f"[cocol] slope vs {axis} ({law}): {fit['slope']:.2f} ± {fit['ci95']:.2f} (theory {theory:+g})",
              flush=True)
    res["cocol"] = out


# ---------------------------------------------------------------------------------------------
# incremental regression
# ---------------------------------------------------------------------------------------------
def reg_run(algo, X, y, C, eps, noise, stream, every, **kw):
    """Final release of ``algo`` on (X, y): total excess L(θ_T) − min_C L, its meta and the seconds."""
    T = len(y)
    t0 = time.perf_counter()
    mech = make_incremental_regression(algo, dim=X.shape[1], constraint=C, epsilon=eps, delta=1e-6,
                                       release_every=every, horizon=T, **kw)
    rel = mech.run(stream, list(zip(X, y)), noise)[-1]
    loss = float(np.sum((y - X @ rel.value["theta"]) ** 2))
    return loss, rel.meta, getattr(mech, "m", None), time.perf_counter() - t0


def part_reg_d(args, res):
    """PRIVINCREG1 (Theorem 4.2: excess O(log^{3/2}T √log(1/δ) R_C² (√d + √log(T/β))/ε)) on
    ``signal_data`` at T = ``--reg-T``, θ released every T/8 steps (warm starts), ε = ``--reg-eps``,
    C = unit L2 and unit L1 ball. Also the theorem's own quantity 2α_T R_C (NOISYPROJGRAD's bound at
    r_t = (1 + L_t/α_t)²), θ = 0's excess and, on the last seed's data, the excess of the same
    schedule without noise (``ZeroNoise``: the solver's own part)."""
    T, out = args.reg_T, []
    for ball in ("l2", "l1"):
        for eps in args.reg_eps:
            rows = []
            for d in args.reg_dims:
                C = L2Ball(d) if ball == "l2" else L1Ball(d)
                ex, zero, bound = [], [], []
                for s in range(args.seeds):
                    X, y = signal_data(T, d, seed=7000 + 31 * d + s)
                    best = ls_min(X, y, C)
                    loss, meta, _, sec = reg_run("privincreg1", X, y, C, eps, NoiseSource(KEY), f"s{s}", T // 8)
                    ex.append(loss - best)
                    zero.append(float(y @ y) - best)
                    bound.append(2 * meta["alpha_t"] * C.radius)
                zloss, *_ = reg_run("privincreg1", X, y, C, eps, ZeroNoise(), f"s{s}", T // 8)  # last seed's data
                rows.append({"d": d, "excess": ex, "theta0": zero, "bound_2alphaR": bound[0], "r_t": meta["r_t"],
                             "noise_free": zloss - best})
                print(f"[reg-d] {ball} ε={eps:g} d={d}: excess {np.mean(ex):.3g} (noise-free {zloss - best:.3g}, "
                      f"θ=0 {np.mean(zero):.3g}, 2αR {bound[0]:.3g}, r_T {meta['r_t']}) {sec:.1f}s/run", flush=True)
            fit = slope_ci([r["d"] for r in rows], np.array([r["excess"] for r in rows]).T)
            bound_fit = float(np.polyfit(np.log([r["d"] for r in rows]), np.log([r["bound_2alphaR"] for r in rows]), 1)[0])
            out.append({"ball": ball, "epsilon": eps, "T": T, "rows": rows, "fit": fit, "bound_slope": bound_fit,
                        "theory": 0.5})
            print(f"[reg-d] {ball} ε={eps:g}: slope vs d {fit['slope']:.2f} ± {fit['ci95']:.2f} (theory ≤ 0.5; "
                  f"2αR bound slope {bound_fit:.2f})", flush=True)
    res["reg_d"] = out


def part_reg2_rate(args, res):
    """PRIVINCREG2 (Theorem 5.7) with OPT ≈ 0 (noise-free labels, θ* inside C), so the bound is its
    first term O(T^{1/3} W^{2/3} log²T R_C² √(log(1/δ) log(1/β))/ε). d = ``--reg2-d``, C = unit L1 ball,
    inputs (3 + nnz)-sparse declared as such (W = w(X) + w(C)), m = ⌈c_m max(W², ln(T/β))/γ²⌉,
    γ = (W/T)^{1/3} with c_m = ``--reg2-cm`` (the paper's constant is unspecified; c_m = 1 gives m ≥ d here).
    One release, at T (cold start; the theorem holds at every t); on the last seed's data also the
    noise-free run (``ZeroNoise``, same schedule: projection + lift + solver) and θ = 0's excess."""
    d, out = args.reg2_d, []
    C = L1Ball(d)
    for nnz in args.reg2_nnz:
        for T in args.reg2_T:
            ex, ms, zero = [], [], []
            kw = {"input_domain": ("sparse", 3 + nnz), "c_m": args.reg2_cm}
            for s in range(args.seeds):
                X, y = signal_data(T, d, seed=9000 + T + nnz + s, nnz=nnz, noise_sd=0.0)
                best = ls_min(X, y, C)
                loss, meta, m, sec = reg_run("privincreg2", X, y, C, args.reg2_eps, NoiseSource(KEY), f"s{s}", T, **kw)
                ex.append(loss - best)
                zero.append(float(y @ y) - best)
                ms.append(m)
            zloss, *_ = reg_run("privincreg2", X, y, C, args.reg2_eps, ZeroNoise(), f"s{s}", T, **kw)
            mech = make_incremental_regression("privincreg2", dim=d, constraint=C, epsilon=args.reg2_eps, delta=1e-6,
                                               horizon=T, input_domain=("sparse", 3 + nnz), c_m=args.reg2_cm)
            W = float(mech.width)
            out.append({"T": T, "nnz": nnz, "W": W, "m": ms[0], "m_capped": bool(mech.m_capped), "excess": ex,
                        "theta0": zero, "noise_free": zloss - best, "x": T ** (1 / 3) * W ** (2 / 3)})
            print(f"[reg2] d={d} k={3 + nnz} W={W:.2f} T={T} m={ms[0]}: excess {np.mean(ex):.3g} (noise-free "
                  f"{zloss - best:.3g}, θ=0 {np.mean(zero):.3g}) "
                  f"(T^1/3 W^2/3 = {out[-1]['x']:.1f}) {sec:.1f}s/run", flush=True)
    fit = slope_ci([r["x"] for r in out], np.array([r["excess"] for r in out]).T)
    by_T = {nnz: slope_ci([r["T"] for r in out if r["nnz"] == nnz],
                          np.array([r["excess"] for r in out if r["nnz"] == nnz]).T) for nnz in args.reg2_nnz}
    print(f"[reg2] slope vs T^1/3 W^2/3: {fit['slope']:.2f} ± {fit['ci95']:.2f} (theory 1); vs T: "
          + ", ".join(f"k={3 + k}: {f['slope']:.2f} ± {f['ci95']:.2f}" for k, f in by_T.items()) + " (theory 1/3)",
          flush=True)
    res["reg2_rate"] = {"d": d, "epsilon": args.reg2_eps, "c_m": args.reg2_cm, "rows": out, "fit": fit,
                        "fit_vs_T": {str(k): v for k, v in by_T.items()}}


def part_regime(args, res):
    """PRIVINCREG1 vs PRIVINCREG2 (explicit m ≪ d) vs θ = 0: ``signal_data`` (noise sd 0.05), C = unit
    L1 ball, T = ``--regime-T``, ε = ``--regime-eps``, releases every T/8. Each mechanism is also run
    with ``ZeroNoise`` (same ε, so the same α_t, r_t, η_t): that run's excess is the solver +
    projection/lift part; the rest of the private run's excess is the privacy noise's."""
    T, rows = args.regime_T, []
    for d in args.regime_dims:
        C = L1Ball(d)
        for s in range(args.regime_seeds):
            X, y = signal_data(T, d, seed=11000 + d + s)
            best = ls_min(X, y, C)
            row = {"d": d, "seed": s, "T": T, "theta0": float(y @ y) - best}
            configs = [] if args.regime_no_reg1 else [("privincreg1", {}, "REG1")]
            configs += [("privincreg2", {"m": m}, f"REG2 m={m}") for m in args.regime_m if m < d]
            if args.regime_paper_m:  # m = ⌈max(W², ln(T/β))/γ²⌉ (c_m = 1); signal_data inputs are 8-sparse
                configs.append(("privincreg2", {"input_domain": ("sparse", 8)}, "REG2 paper m"))
            for algo, kw, label in configs:
                kw = {**kw, "calibration": args.regime_calibration}
                loss, meta, m, sec = reg_run(algo, X, y, C, args.regime_eps, NoiseSource(KEY), f"s{s}", T // 8, **kw)
                print(f"[regime] d={d} s={s} {label} (m={m}): private excess {loss - best:.3g} {sec:.1f}s", flush=True)
                zloss, zmeta, _, _ = reg_run(algo, X, y, C, args.regime_eps, ZeroNoise(), f"s{s}", T // 8, **kw)
                row[label] = {"excess": loss - best, "noise_free": zloss - best, "r_t": meta["r_t"],
                              "alpha_t": meta["alpha_t"], "m": m, "m_capped": meta["m_capped"], "seconds": sec}
                print(f"[regime] d={d} s={s} {label} (m={m}): excess {loss - best:.3g} (noise-free {zloss - best:.3g}; "
                      f"θ=0 {row['theta0']:.3g}; r_T {meta['r_t']}, α_T {meta['alpha_t']:.3g}) {sec:.1f}s", flush=True)
            rows.append(row)
    res["regime"] = {"T": T, "epsilon": args.regime_eps, "calibration": args.regime_calibration, "rows": rows}


# ---------------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------------
def fmt_fit(f):
    return f"{f['slope']:.2f} ± {f['ci95']:.2f}"


def tables(res) -> str:
    lines = []
    if "cocol" in res:
        lines += ["| sweep | noise | constants | fitted | points: private regret (non-private) | slope (95% CI) | theory |",
                  "|---|---|---|---|---|---|---|"]
        for sw in res["cocol"]:
            key = "d" if sw["axis"] == "d" else "epsilon"
            pts = ", ".join(f"{key[0]}={r[key]:g}: {np.mean(r['regret']):.2f} ({np.mean(r['non_private']):.2f})"
                            for r in sw["rows"])
            what = "private − non-private" if sw["fitted"] == "excess" else "private regret"
            consts = "paper" if sw["paper_constants"] else "α=0.1, C0=20"
            lines.append(f"| vs {sw['axis']} (T={sw['T']}) | {sw['noise']} | {consts}"
                         f" | {what} | {pts} | {fmt_fit(sw['fit'])} | {sw['theory']:+g} |")
    if "reg_d" in res:
        lines += ["", "| ball | ε | d: excess (noise-free; θ=0) [2αR] | slope vs d (95% CI) | 2αR slope | theory |",
                  "|---|---|---|---|---|---|"]
        for sw in res["reg_d"]:
            pts = ", ".join(f"{r['d']}: {np.mean(r['excess']):.3g} ({r['noise_free']:.3g}; {np.mean(r['theta0']):.3g})"
                            f" [{r['bound_2alphaR']:.3g}]" for r in sw["rows"])
            lines.append(f"| {sw['ball']} | {sw['epsilon']:g} | {pts} | {fmt_fit(sw['fit'])} | {sw['bound_slope']:.2f} | 0.5 |")
    if "reg2_rate" in res:
        r2 = res["reg2_rate"]
        lines += ["", "| k | W | T | m | T^1/3 W^2/3 | excess (mean over seeds) | noise-free | θ = 0 |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in r2["rows"]:
            lines.append(f"| {3 + r['nnz']} | {r['W']:.2f} | {r['T']} | {r['m']} | {r['x']:.1f} | {np.mean(r['excess']):.3g} "
                         f"| {r['noise_free']:.3g} | {np.mean(r['theta0']):.3g} |")
        lines.append(f"\nslope vs T^1/3 W^2/3: {fmt_fit(r2['fit'])} (theory 1); vs T: "
                     + ", ".join(f"k={3 + int(k)}: {fmt_fit(f)}" for k, f in r2["fit_vs_T"].items()) + " (theory 1/3)")
    if "regime" in res:
        rg = res["regime"]
        labels = list(dict.fromkeys(k for r in rg["rows"] for k in r if k.startswith("REG")))
        lines += ["", "| d | seed | θ=0 | " + " | ".join(f"{k} excess (noise-free)" for k in labels) + " |",
                  "|---|---|---|" + "---|" * len(labels)]
        for r in rg["rows"]:
            lines.append(f"| {r['d']} | {r['seed']} | {r['theta0']:.3g} | "
                         + " | ".join(f"{r[k]['excess']:.3g} ({r[k]['noise_free']:.3g})" if k in r else "–"
                                      for k in labels) + " |")
    return "\n".join(lines)


def _log_axes(ax, ylabel: str) -> None:
    for a in ax:
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_ylabel(ylabel)
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7)


def figures(res, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "cocol" in res:
        fig, ax = plt.subplots(1, 2, figsize=(11, 4))
        for sw in res["cocol"]:
            a = ax[0] if sw["axis"] == "d" else ax[1]
            key = "d" if sw["axis"] == "d" else "epsilon"
            x = [r[key] for r in sw["rows"]]
            y = [np.mean(r[sw["fitted"]]) for r in sw["rows"]]
            label = f"{sw['noise']}, {'paper consts' if sw['paper_constants'] else 'C0=20'}: slope {sw['fit']['slope']:.2f}"
            a.plot(x, y, marker="o", label=label)
        ax[0].set_xlabel("d")
        ax[1].set_xlabel("ε")
        _log_axes(ax, "regret (private − non-private; paper consts: private)")
        ax[0].set_title("WDP-COCOL, simplex: regret vs d")
        ax[1].set_title("WDP-COCOL, simplex: regret vs ε")
        fig.tight_layout()
        fig.savefig(out / "online_rates_cocol.png", dpi=110)
    if "reg_d" in res or "reg2_rate" in res:
        fig, ax = plt.subplots(1, 2, figsize=(11, 4))
        for sw in res.get("reg_d", []):
            x = [r["d"] for r in sw["rows"]]
            ax[0].plot(x, [np.mean(r["excess"]) for r in sw["rows"]], marker="o",
                       label=f"REG1 {sw['ball']} ε={sw['epsilon']:g}: slope {sw['fit']['slope']:.2f}")
            ax[0].plot(x, [np.mean(r["theta0"]) for r in sw["rows"]], ls=":", color="grey")
        ax[0].set_title("PRIVINCREG1 excess vs d (dotted: θ = 0)")
        ax[0].set_xlabel("d")
        if "reg2_rate" in res:
            r2 = res["reg2_rate"]
            for nnz in sorted({r["nnz"] for r in r2["rows"]}):
                rows = [r for r in r2["rows"] if r["nnz"] == nnz]
                line, = ax[1].plot([r["x"] for r in rows], [np.mean(r["excess"]) for r in rows], marker="o",
                                   label=f"REG2 k={3 + nnz}: slope vs T {r2['fit_vs_T'][str(nnz)]['slope']:.2f}")
                ax[1].plot([r["x"] for r in rows], [np.mean(r["theta0"]) for r in rows], ls=":", color=line.get_color())
            ax[1].set_title(f"PRIVINCREG2, d={r2['d']}, c_m={r2['c_m']:g} (dotted: θ = 0)")
            ax[1].set_xlabel("T^(1/3) W^(2/3)")
        _log_axes(ax, "excess empirical risk (sum form)")
        fig.tight_layout()
        fig.savefig(out / "online_rates_regression.png", dpi=110)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="/tmp/online_rates")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (seconds), for the tests")
    p.add_argument("--no-figures", action="store_true")
    for part in ("cocol", "reg-d", "reg2-rate", "regime"):
        p.add_argument(f"--{part}", action="store_true", help=f"run the {part} part (default: all parts)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--cocol-T", type=int, default=2**12)
    p.add_argument("--cocol-sweeps", nargs="+", default=["d-gamma", "d-gaussian", "eps", "eps-paper"],
                   choices=["d-gamma", "d-gaussian", "eps", "eps-paper"])
    p.add_argument("--cocol-dims", type=int, nargs="+", default=[2, 5, 10, 20, 50])
    p.add_argument("--cocol-eps", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0, 8.0, 16.0])
    p.add_argument("--cocol-paper-eps", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0],
                   help="ε sweep at d = 2 with the paper's constants")
    p.add_argument("--cocol-paper-T", type=int, default=2**14)
    p.add_argument("--reg-T", type=int, default=4096)
    p.add_argument("--reg-dims", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    p.add_argument("--reg-eps", type=float, nargs="+", default=[10.0])
    p.add_argument("--reg2-d", type=int, default=256)
    p.add_argument("--reg2-T", type=int, nargs="+", default=[256, 512, 1024])
    p.add_argument("--reg2-nnz", type=int, nargs="+", default=[5, 29])
    p.add_argument("--reg2-cm", type=float, default=0.01)
    p.add_argument("--reg2-eps", type=float, default=100.0)
    p.add_argument("--regime-dims", type=int, nargs="+", default=[128, 512])
    p.add_argument("--regime-m", type=int, nargs="*", default=[16, 64], help="explicit m values (none: only --regime-paper-m)")
    p.add_argument("--regime-no-reg1", action="store_true", help="skip PRIVINCREG1 (its row is known)")
    p.add_argument("--regime-paper-m", action="store_true",
                   help="also PRIVINCREG2 with the paper's m (c_m = 1, inputs declared 8-sparse; capped at d − 1)")
    p.add_argument("--regime-calibration", choices=["paper", "analytic"], default="paper",
                   help="tree noise calibration (analytic: the smallest certified σ, needed for large ε)")
    p.add_argument("--regime-T", type=int, default=1024)
    p.add_argument("--regime-eps", type=float, default=10.0)
    p.add_argument("--regime-seeds", type=int, default=1)
    args = p.parse_args(argv)
    if args.smoke:
        args.seeds, args.regime_seeds = 2, 1
        args.cocol_T, args.cocol_dims, args.cocol_eps = 64, [2, 4], [4.0, 16.0]
        args.cocol_paper_eps, args.cocol_paper_T = [4.0, 16.0], 64
        args.reg_T, args.reg_dims = 64, [8, 16]
        args.reg2_d, args.reg2_T, args.reg2_nnz, args.reg2_cm = 32, [64, 128], [2], 0.01
        args.regime_dims, args.regime_m, args.regime_T = [16], [4], 64
    return args


def main(argv=None) -> None:
    args = parse(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chosen = [p for p in ("cocol", "reg_d", "reg2_rate", "regime") if getattr(args, p)] or \
        ["cocol", "reg_d", "reg2_rate", "regime"]
    res: dict = {"smoke": args.smoke, "argv": sys.argv[1:] if argv is None else list(argv)}
    t0 = time.time()
    for part in chosen:
        {"cocol": part_cocol, "reg_d": part_reg_d, "reg2_rate": part_reg2_rate, "regime": part_regime}[part](args, res)
    res["wall_s"] = time.time() - t0
    (out / "rates.json").write_text(json.dumps(res, indent=1))
    (out / "rates.md").write_text(tables(res))
    if not args.no_figures:
        figures(res, out)
    print(tables(res))
    print(f"wall {res['wall_s']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
