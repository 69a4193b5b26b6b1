"""Reproduction: private online learning with expiration (Lou & Cheung, "Projection-free Online ERM with Privacy-preserving and Privacy Expiration") and incremental regression (Kasiviswanathan, Nissim & Jin, "Private Incremental Regression").

Default run (a few minutes on 2 cores; run with ``nice -n 10``)::

    nice -n 10 .venv/bin/python benchmarks/reproduce_online_regression.py --out /tmp/online_repro

Full sizes (the acceptance checks at their full sizes; d up to 1,000): add ``--full`` (long: ~1 h).

Large d on a GPU (issue 27.5): ``--dim 1000 --device cuda`` runs the m ≪ d regime (part 4) at d = 1000
with PRIVINCREG₁/₂'s trees and gradient on torch (``--backend torch`` is implied by ``--device cuda``;
numpy stays the default and the reference). Small on CPU::

    nice -n 10 .venv/bin/python benchmarks/reproduce_online_regression.py --dim 64 --regime-T 256 --backend torch

``--calibrations`` runs only the window tree's Gaussian calibrations side by side (paper's eq. 16
against the exact analytic sigma, WDP-COCOL and WDP-COCOP regret)::

    nice -n 10 .venv/bin/python benchmarks/reproduce_online_regression.py --calibrations --out /tmp/calib

Parts
1. Regret vs T: WDP-COCOP (unit ball, d = 5, f_t = ½‖x − z_t‖², W = 16, ε = 4, Gamma noise) against
   non-private FTAL (the same mechanism with the test-only ZeroNoise) and full-horizon privacy
   (window = T); WDP-COCOL on the simplex (d = 2, paper constants, window (1, 1e-5), W = 16).
2. Regression excess empirical risk ``L(θ_t; Γ_t) − min_C L`` for PRIVINCREG1/2 and PRIVINCERM on
   synthetic 3-sparse data (C = unit L1 ball, inputs with 5 non-zeros) vs T and d, and on
   scikit-learn's diabetes data (d = 10, n = 442). (ε, δ) = (1, 1e-6).
3. Per-step latency of each mechanism (pure numpy, this machine).

Writes ``results.json``, markdown tables (``tables.md``) and PNG figures into ``--out`` (copy the
figures to ``docs/figures/``).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from beam_dp.core import NoiseSource
from beam_dp.mechanisms.online.convex_sets import L1Ball, L2Ball, Simplex
from beam_dp.mechanisms.online.learners import WDPCOCOL, WDPCOCOP, OnlineLoss
from beam_dp.mechanisms.online.regression import make_incremental_regression
from beam_dp.testing.noise import ZeroNoise

KEY = bytes(range(32))  # public benchmark key: results are reproducible, not secret


def quadratic(mu: float, lipschitz: float) -> OnlineLoss:
    return OnlineLoss(kind="custom", mu=mu, lipschitz=lipschitz, gradient=lambda x, a, b: mu * (x - a))


def ball_points(T, d, seed):
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((T, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    z = u * (0.5 * rng.random(T) ** (1.0 / d))[:, None]
    z[:, 0] += 0.9
    return z


def regret_curve(mech, z, noise, stream, horizons):
    t0 = time.perf_counter()
    rels = mech.run(stream, [(zi, 0.0) for zi in z], noise)
    per_step = (time.perf_counter() - t0) / len(z)
    X = np.vstack([mech.x1] + [r.value["x"] for r in rels[:-1]])
    cum = np.cumsum(0.5 * mech.mu * ((X - z) ** 2).sum(axis=1))
    out = []
    for T in horizons:
        best = mech.constraint.project(z[:T].mean(axis=0))
        out.append(cum[T - 1] - 0.5 * mech.mu * ((best - z[:T]) ** 2).sum())
    return np.array(out), per_step


def part_online(args, res):
    T = 2**15 if args.full else 2**13
    seeds = range(8 if args.full else 2)
    horizons = [2**k for k in range(6, int(math.log2(T)) + 1)]
    curves, latency = {}, {}
    configs = {
        "COCOP W=16 eps=4": dict(window=16, epsilon=4.0, noise=NoiseSource(KEY)),
        "COCOP W=64 eps=4": dict(window=64, epsilon=4.0, noise=NoiseSource(KEY)),
        "COCOP full horizon (W=T) eps=4": dict(window=T, epsilon=4.0, noise=NoiseSource(KEY)),
        "non-private FTAL": dict(window=16, epsilon=4.0, noise=ZeroNoise()),
    }
    for name, cfg in configs.items():
        mech = WDPCOCOP(dim=5, constraint=L2Ball(5), loss=quadratic(1.0, 2.4), epsilon=cfg["epsilon"], window=cfg["window"])
        runs = []
        for s in seeds:
            r, lat = regret_curve(mech, ball_points(T, 5, s), cfg["noise"], f"seed{s}", horizons)
            runs.append(r)
            latency[name] = lat
        curves[name] = np.mean(runs, axis=0).tolist()
        print(f"[online] {name}: regret {np.round(curves[name], 2).tolist()}", flush=True)
    # COCOL on the simplex, paper constants (C_0 = 2500)
    Tc = 2**16 if args.full else 2**14
    hc = [2**k for k in range(8, int(math.log2(Tc)) + 1)]
    cseeds = range(4 if args.full else 1)
    for name, noise in (("COCOL simplex (1, 1e-5) W=16", NoiseSource(KEY)), ("COCOL simplex non-private", ZeroNoise())):
        mech = WDPCOCOL(dim=2, constraint=Simplex(2), loss=quadratic(1.0, 2.0), epsilon=1.0, delta=1e-5,
                        noise="gaussian", window=16, calibration="paper")  # analytic: part_calibrations
        runs = []
        for s in cseeds:
            z = np.array([0.6, 0.4]) + 0.2 * np.random.default_rng(s).standard_normal((Tc, 2))
            r, lat = regret_curve(mech, z, noise, f"seed{s}", hc)
            runs.append(r)
            latency[name] = lat
        curves[name] = np.mean(runs, axis=0).tolist()
        print(f"[online] {name}: regret {np.round(curves[name], 2).tolist()}", flush=True)
    res["online"] = {"horizons": horizons, "cocol_horizons": hc, "curves": curves, "latency_s": latency,
                     "seeds": len(seeds), "cocol_seeds": len(cseeds)}


def part_calibrations(args, res):
    """Window-tree Gaussian calibrations side by side: WDP-COCOL on the simplex (the part-1 setup:
    d = 2, paper constants, window (1, 1e-5), W = 16, 1 seed to 2^14) and WDP-COCOP on the unit ball
    (d = 5, window (4, 1e-5), W = 16, 2 seeds to 2^13), each with ``calibration="paper"`` (eq. 16,
    certified) and ``"analytic"`` (the exact sigma, the default), and the non-private run (ZeroNoise)."""
    rows, horizons = {}, {}
    setups = {
        "COCOL simplex (1, 1e-5) W=16": (2**14, range(1), lambda cal: WDPCOCOL(
            dim=2, constraint=Simplex(2), loss=quadratic(1.0, 2.0), epsilon=1.0, delta=1e-5, noise="gaussian",
            window=16, calibration=cal),
            lambda T, s: np.array([0.6, 0.4]) + 0.2 * np.random.default_rng(s).standard_normal((T, 2))),
        "COCOP ball d=5 (4, 1e-5) W=16": (2**13, range(2), lambda cal: WDPCOCOP(
            dim=5, constraint=L2Ball(5), loss=quadratic(1.0, 2.4), epsilon=4.0, delta=1e-5, noise="gaussian",
            window=16, calibration=cal), lambda T, s: ball_points(T, 5, s)),
    }
    for setup, (T, seeds, make, data) in setups.items():
        horizons[setup] = [2**k for k in range(8, int(math.log2(T)) + 1)]
        for label, cal, noise in (("paper", "paper", NoiseSource(KEY)), ("analytic", "analytic", NoiseSource(KEY)),
                                  ("non-private", "analytic", ZeroNoise())):
            mech = make(cal)
            curves = [regret_curve(mech, data(T, s), noise, f"seed{s}", horizons[setup])[0] for s in seeds]
            rows[f"{setup} {label}"] = {"regret": np.mean(curves, axis=0).tolist(), "sigma": mech.tree.node_noise.scale,
                                        "seeds": len(seeds)}
            print(f"[calibration] {setup} {label} (sigma {mech.tree.node_noise.scale:.4g}): regret "
                  f"{np.round(rows[f'{setup} {label}']['regret'], 2).tolist()}", flush=True)
    res["calibrations"] = {"horizons": horizons, "rows": rows}


def sparse_data(T, d, seed, k=3, nnz=5):
    rng = np.random.default_rng(seed)
    theta = np.zeros(d)
    theta[rng.choice(d, k, replace=False)] = rng.normal(size=k)
    theta *= 0.8 / np.abs(theta).sum()
    X = np.zeros((T, d))
    for i in range(T):
        X[i, rng.choice(d, nnz, replace=False)] = rng.normal(size=nnz)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = np.clip(X @ theta + 0.1 * rng.normal(size=T), -1, 1)
    return X, y


def ls_min(X, y, C, iters=3000):
    """min_C Σ(y − Xθ)² by FISTA (reference optimum for the excess risk)."""
    d = X.shape[1]
    L = 2 * np.linalg.norm(X, 2) ** 2 + 1e-12
    u = np.zeros(d)
    v, tk = u.copy(), 1.0
    for _ in range(iters):
        new = C.project(v - 2 * X.T @ (X @ v - y) / L)
        t1 = 0.5 * (1 + math.sqrt(1 + 4 * tk * tk))
        v = new + (tk - 1) / t1 * (new - u)
        u, tk = new, t1
    return float(np.sum((y - X @ u) ** 2))


def backend_kw(args, algo: str) -> dict:
    """PRIVINCREG₁/₂'s ``backend``/``device`` from the flags (PRIVINCERM has numpy only)."""
    return {"backend": args.backend, "device": args.device} if algo != "privincerm" else {}


def regression_run(algo, X, y, C, T, noise, every, backend=None, **kw):
    d = X.shape[1]
    mech = make_incremental_regression(algo, dim=d, constraint=C, epsilon=1.0, delta=1e-6, release_every=every,
                                       **(backend or {}), **kw)
    t0 = time.perf_counter()
    rels = mech.run("s", list(zip(X[:T], y[:T])), noise)
    per_step = (time.perf_counter() - t0) / T
    excess = {}
    for r in rels:
        t = r.step
        th = r.value["theta"]
        excess[t] = float(np.sum((y[:t] - X[:t] @ th) ** 2)) - ls_min(X[:t], y[:t], C)
    return excess, per_step, getattr(mech, "m", None)


def part_regression(args, res):
    noise = NoiseSource(KEY)
    Ts = [64, 256, 1024] if not args.full else [64, 256, 1024, 4096]
    dims = args.dims or ([20, 100] if not args.full else [20, 100, 1000])
    out, latency = [], {}
    for d in dims:
        Tmax = Ts[-1]
        X, y = sparse_data(Tmax, d, seed=d)
        C = L1Ball(d)
        every = Tmax // 8
        for algo, kw in (("privincreg1", {"horizon": Tmax}), ("privincreg2", {"horizon": Tmax, "input_domain": ("sparse", 5)}),
                         ("privincerm", {"horizon": Tmax, "iterations": 50})):
            if algo == "privincreg1" and d > 200 and not (args.full or args.dims):
                continue  # d² = 10⁶-entry tree: run only when asked for (--full or --dims)
            exc, lat, m = regression_run(algo, X, y, C, Tmax, noise, every, backend_kw(args, algo), **kw)
            latency[f"{algo} d={d}"] = lat
            for T in Ts:
                near = min(exc, key=lambda t: abs(t - T))
                out.append({"data": "sparse", "d": d, "algo": algo, "T": near, "excess": exc[near], "m": m})
            print(f"[regression] d={d} {algo} m={m}: " + ", ".join(f"T={t}: {exc[t]:.3g}" for t in sorted(exc)), flush=True)
    # diabetes (scikit-learn), d = 10, n = 442, shuffled once
    from sklearn.datasets import load_diabetes

    Xd, yd = load_diabetes(return_X_y=True)
    perm = np.random.default_rng(0).permutation(len(yd))
    Xd = Xd[perm] / np.linalg.norm(Xd, axis=1).max()
    yd = (yd[perm] - yd.mean()) / (np.abs(yd - yd.mean()).max())
    T = len(yd)
    C = L1Ball(10)
    for algo, kw in (("privincreg1", {"horizon": T}), ("privincreg2", {"horizon": T, "m": 5}),
                     ("privincerm", {"horizon": T, "iterations": 50})):
        exc, lat, m = regression_run(algo, Xd, yd, C, T, noise, 55, **kw)
        for t in sorted(exc):
            out.append({"data": "diabetes", "d": 10, "algo": algo, "T": t, "excess": exc[t], "m": m})
        print(f"[diabetes] {algo}: " + ", ".join(f"T={t}: {exc[t]:.3g}" for t in sorted(exc)), flush=True)
    res["regression"] = out
    res["regression_latency_s"] = latency


def part_regret_sweep(args, res):
    """Issue 17: WDP-COCOP regret against d and ε (Option I, Gamma noise: Regret = O(d·ln T/ε), spec
    Theorem 3). Setup of part 1 (unit L2 ball, f_t = ½‖x − z_t‖², L = 2.4, μ = 1, W = 16), T = 2^12, one
    seed; the private regret minus the non-private (ZeroNoise) regret on the same data is fitted
    against d (at ε = 4; theory slope +1) and against ε (at d = 5; theory slope −1)."""
    T, W = args.sweep_T, 16
    dims, epss = args.sweep_dims, args.sweep_eps
    rows = []
    for d in dims:
        z = ball_points(T, d, seed=d)
        base, _ = regret_curve(WDPCOCOP(dim=d, constraint=L2Ball(d), loss=quadratic(1.0, 2.4), epsilon=1.0, window=W),
                               z, ZeroNoise(), "np", [T])
        for eps in epss:
            if d != 5 and eps != 4.0:
                continue  # the ε sweep runs at d = 5 only
            mech = WDPCOCOP(dim=d, constraint=L2Ball(d), loss=quadratic(1.0, 2.4), epsilon=eps, window=W)
            reg, _ = regret_curve(mech, z, NoiseSource(KEY), f"d{d}e{eps}", [T])
            rows.append({"d": d, "epsilon": eps, "T": T, "regret": float(reg[0]), "non_private": float(base[0]),
                         "excess": float(reg[0] - base[0])})
            print(f"[regret] d={d} ε={eps:g} T={T}: regret {reg[0]:.2f} (non-private {base[0]:.2f})", flush=True)
    by_d = [r for r in rows if r["epsilon"] == 4.0]
    by_e = [r for r in rows if r["d"] == 5]
    fit = {
        "slope_vs_d": float(np.polyfit(np.log([r["d"] for r in by_d]), np.log([r["excess"] for r in by_d]), 1)[0]),
        "slope_vs_epsilon": float(np.polyfit(np.log([r["epsilon"] for r in by_e]),
                                             np.log([r["excess"] for r in by_e]), 1)[0]),
    }
    print(f"[regret] fitted slopes: vs d {fit['slope_vs_d']:.2f} (theory +1), vs ε {fit['slope_vs_epsilon']:.2f} "
          "(theory −1)", flush=True)
    res["regret_sweep"] = {"rows": rows, "fit": fit}


def signal_data(T, d, seed, k=3, nnz=5, noise_sd=0.05):
    """3-sparse θ* (‖θ*‖₁ = 0.8) whose support is non-zero in **every** input (plus ``nnz`` random
    coordinates), ‖x‖ = 1, y = ⟨x, θ*⟩ + N(0, noise_sd²) clipped to [−1, 1]: y carries signal at any d,
    so θ = 0 is a poor estimator (``sparse_data`` inputs rarely touch the support when d ≫ 5)."""
    rng = np.random.default_rng(seed)
    support = rng.choice(d, k, replace=False)
    theta = np.zeros(d)
    theta[support] = rng.choice([-1.0, 1.0], k) * (0.8 / k)
    X = np.zeros((T, d))
    for i in range(T):
        X[i, rng.choice(d, nnz, replace=False)] = rng.normal(size=nnz)
    X[:, support] = rng.normal(size=(T, k))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = np.clip(X @ theta + noise_sd * rng.normal(size=T), -1, 1)
    return X, y


def part_regime(args, res):
    """Issue 17: a regime where PRIVINCREG2 really projects (explicit m ≪ d) and the private estimators
    are compared with θ = 0. ``signal_data`` (support always active), C = unit L1 ball,
    (ε, δ) = (``--regime-eps``, 1e-6); excess empirical risk per sample, (L(θ_T) − min_C L)/T, at the final T, and the
    same for θ = 0 (its excess is Σy² − min_C L)."""
    noise = NoiseSource(KEY)
    T = args.regime_T
    rows = []
    for d in args.regime_dims:
        X, y = signal_data(T, d, seed=1000 + d)
        C = L1Ball(d)
        best = ls_min(X, y, C)
        zero = (float(np.sum(y**2)) - best) / T
        for algo, kw in (("privincreg1", {"horizon": T}), ("privincreg2", {"horizon": T, "m": args.regime_m}),
                         ("privincerm", {"horizon": T, "iterations": 50})):
            t0 = time.perf_counter()
            mech = make_incremental_regression(algo, dim=d, constraint=C, epsilon=args.regime_eps, delta=1e-6,
                                               release_every=T, **backend_kw(args, algo), **kw)
            (rel,) = mech.run("s", list(zip(X, y)), noise)[-1:]
            th = rel.value["theta"]
            excess = (float(np.sum((y - X @ th) ** 2)) - best) / T
            rows.append({"d": d, "T": T, "epsilon": args.regime_eps, "algo": algo,
                         "backend": getattr(mech, "backend", "numpy"), "device": getattr(mech, "device", "cpu"), "m": getattr(mech, "m", None), "excess_per_sample": excess,
                         "theta0_excess_per_sample": zero, "seconds": time.perf_counter() - t0})
            print(f"[regime] d={d} T={T} {algo} m={getattr(mech, 'm', None)}: excess/T {excess:.4g} "
                  f"(θ=0: {zero:.4g}) {time.perf_counter() - t0:.1f}s", flush=True)
    res["regime"] = rows


def figures(res, out: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    on = res["online"]
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for name, curve in on["curves"].items():
        if name.startswith("COCOP") or name == "non-private FTAL":
            ax[0].plot(on["horizons"], curve, marker="o", label=name)
        else:
            ax[1].plot(on["cocol_horizons"], curve, marker="o", label=name)
    for a, title in zip(ax, ("WDP-COCOP, unit ball, d=5", "WDP-COCOL, simplex, d=2, C_0=2500")):
        a.set_xscale("log", base=2)
        a.set_xlabel("T")
        a.set_ylabel("mean regret")
        a.set_title(title)
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "online_regret.png", dpi=110)
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    rows = res["regression"]
    for algo in ("privincreg1", "privincreg2", "privincerm"):
        for d in sorted({r["d"] for r in rows if r["data"] == "sparse"}):
            pts = [(r["T"], r["excess"]) for r in rows if r["data"] == "sparse" and r["algo"] == algo and r["d"] == d]
            if pts:
                ax[0].plot(*zip(*pts), marker="o", label=f"{algo} d={d}")
        pts = [(r["T"], r["excess"]) for r in rows if r["data"] == "diabetes" and r["algo"] == algo]
        ax[1].plot(*zip(*pts), marker="o", label=algo)
    ax[0].set_title("synthetic 3-sparse, L1 ball")
    ax[1].set_title("diabetes (d=10), L1 ball")
    for a in ax:
        a.set_xscale("log", base=2)
        a.set_yscale("symlog")
        a.set_xlabel("T")
        a.set_ylabel("excess empirical risk")
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "online_regression_excess.png", dpi=110)


def tables(res) -> str:
    on = res["online"]
    lines = ["| mechanism | " + " | ".join(f"T=2^{int(math.log2(t))}" for t in on["horizons"]) + " |",
             "|---|" + "---|" * len(on["horizons"])]
    for name, curve in on["curves"].items():
        if name.startswith("COCOP") or name == "non-private FTAL":
            lines.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in curve) + " |")
    lines += ["", "| mechanism | " + " | ".join(f"T=2^{int(math.log2(t))}" for t in on["cocol_horizons"]) + " |",
              "|---|" + "---|" * len(on["cocol_horizons"])]
    for name, curve in on["curves"].items():
        if name.startswith("COCOL"):
            lines.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in curve) + " |")
    lines += ["", "| data | d | algorithm | m | T | excess risk |", "|---|---|---|---|---|---|"]
    for r in res["regression"]:
        lines.append(f"| {r['data']} | {r['d']} | {r['algo']} | {r['m'] or ''} | {r['T']} | {r['excess']:.4g} |")
    lines += ["", "| mechanism | µs per step |", "|---|---|"]
    for name, s in {**on["latency_s"], **res["regression_latency_s"]}.items():
        lines.append(f"| {name} | {s * 1e6:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="/tmp/online_repro")
    parser.add_argument("--full", action="store_true", help="full sizes (8 seeds to 2^15, COCOL to 2^16, d = 1000)")
    parser.add_argument("--skip-online", action="store_true")
    parser.add_argument("--skip-regression", action="store_true")
    parser.add_argument("--dims", type=int, nargs="+", default=None,
                        help="synthetic regression dimensions (default 20 100; --full adds 1000)")
    parser.add_argument("--regime", action="store_true", help="only the m ≪ d regime (issue 17)")
    parser.add_argument("--regime-dims", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--regime-m", type=int, default=8)
    parser.add_argument("--regime-T", type=int, default=2048)
    parser.add_argument("--regime-eps", type=float, default=1.0)
    parser.add_argument("--backend", choices=("numpy", "torch"), default="numpy",
                        help="PRIVINCREG1/2 backend (torch: trees and gradient on --device)")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                        help="torch device of PRIVINCREG1/2 (cuda or auto imply --backend torch)")
    parser.add_argument("--dim", type=int, default=None, help="run only the regime part at this d (e.g. 1000 on a GPU)")
    parser.add_argument("--regret-sweep", action="store_true", help="only WDP-COCOP regret vs d and ε (issue 17)")
    parser.add_argument("--sweep-dims", type=int, nargs="+", default=[2, 5, 20, 50])
    parser.add_argument("--sweep-eps", type=float, nargs="+", default=[1.0, 4.0, 16.0, 64.0])
    parser.add_argument("--sweep-T", type=int, default=2**12)
    parser.add_argument("--calibrations", action="store_true",
                        help="only the window tree's paper vs analytic Gaussian calibration (COCOL, COCOP regret)")
    args = parser.parse_args()
    if args.device != "cpu":
        args.backend = "torch"
    if args.dim is not None:
        args.regime, args.regime_dims = True, [args.dim]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"full": args.full}
    t0 = time.time()
    if args.calibrations:
        part_calibrations(args, res)
        (out / "calibrations.json").write_text(json.dumps(res, indent=1))
        print(f"wall {time.time() - t0:.0f} s", flush=True)
        return
    if args.regret_sweep:
        part_regret_sweep(args, res)
        (out / "regret_sweep.json").write_text(json.dumps(res, indent=1))
        return
    if args.regime:
        part_regime(args, res)
        (out / "regime.json").write_text(json.dumps(res, indent=1))
        return
    if not args.skip_online:
        part_online(args, res)
    if not args.skip_regression:
        part_regression(args, res)
    res["wall_s"] = time.time() - t0
    (out / "results.json").write_text(json.dumps(res, indent=1))
    if "online" in res and "regression" in res:
        figures(res, out)
        (out / "tables.md").write_text(tables(res))
        print(tables(res))
    print(f"wall {res['wall_s']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
