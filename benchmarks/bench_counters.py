"""Counters vs the binary tree: exact max/mean per-step variance, empirical check, state size, time per step.

Conventions: prefix sums at ``t ∈ [1, T]``; tree levels include the root (``L_T = ⌊log₂ T⌋ + 1``).
(ε, δ) counters are compared in units of ``z²Δ₂²`` (``z`` = the exact analytic-Gaussian noise
multiplier at (ε, δ) for sensitivity 1; every counter here calibrates exactly, so the units cancel);
pure-ε counters in units of ``(d+1)(Δ₂/ε)²`` (K-norm). Exact variances use O(T·log T) vectorised
numpy formulas, checked against the mechanisms' own ``noise_var`` at T = 1024.

    nice -n 10 .venv/bin/python benchmarks/bench_counters.py [--full] [--figure docs/figures/counters.png]

Default: T = 2^10, 2^12, 2^16, 2^20 (all exact), empirical check at T = 256 with 400 runs, timings
over 1,000 steps. ``--full``: 2,000 runs and 4,000 steps.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from beam_dp.core import NoiseSource
from beam_dp.mechanisms import BinaryTreeSum, HybridTreeSum
from beam_dp.mechanisms.sums import make_counter
from beam_dp.mechanisms.sums.fitted_params import UNBOUNDED_FIT_HORIZON, blt_for, kary_fit_for
from beam_dp.mechanisms.sums.kary_math import honaker_variances, kary_digits, pure_estimate_vars
from beam_dp.mechanisms.sums.toeplitz import sqrt_coeffs

HORIZONS = (2**10, 2**12, 2**16, 2**20)
EPS, DELTA = 1.0, 1e-6


def popcount(t: np.ndarray) -> np.ndarray:
    return np.array([int(x).bit_count() for x in t]) if t.size < 5000 else np.unpackbits(
        t.astype(">u4").view(np.uint8)).reshape(-1, 32).sum(axis=1)


def tree_like(t: np.ndarray, arity: int, levels: int, v: np.ndarray) -> np.ndarray:
    return kary_digits(t, arity, levels).T @ v


def gaussian_curves(T: int) -> dict[str, np.ndarray]:
    """Per-step variance (units z²Δ₂²) of each (ε, δ) counter for t = 1..T."""
    t = np.arange(1, T + 1)
    L = T.bit_length()
    c = sqrt_coeffs(T)
    blt, blt_u, blt_mean = blt_for(T), blt_for(None), blt_for(T, "mean")
    return {
        "binary tree": popcount(t) * float(L),
        "honaker (binary)": tree_like(t, 2, L, honaker_variances([float(L)] * L, 2)),
        "toeplitz sqrt": np.sum(c**2) * np.cumsum(c**2),
        "blt (4 buffers)": blt.col_norm_sq(T) * blt.direct_row_norm_sq(T),
        "blt (4 buffers, mean-error fit)": blt_mean.col_norm_sq(T) * blt_mean.direct_row_norm_sq(T),
        "blt unbounded": blt_u.col_norm_sq(math.inf) * blt_u.direct_row_norm_sq(T),
    }


def smooth_binary_max(T: int) -> float:
    """Leading-order max variance of the smooth binary mechanism (Andersson–Pagh 2023) with pure-ε
    noise: leaves = indices of a height-h tree with ⌈h/2⌉ one-bits (smallest h with C(h,⌈h/2⌉) >= T),
    each release sums ⌈h/2⌉ nodes, each element is in h+1 nodes of scale (h+1)Δ₂/ε."""
    h = 1
    while math.comb(h, math.ceil(h / 2)) < T:
        h += 1
    return math.ceil(h / 2) * (h + 1) ** 2


def pure_curves(T: int) -> dict[str, np.ndarray]:
    """Per-step variance (units (d+1)(Δ₂/ε)²) of each pure-ε counter for t = 1..T."""
    t = np.arange(1, T + 1)
    L = T.bit_length()
    fit = kary_fit_for(T)
    best_uniform = None
    for arity in range(2, 17):
        levels = 1
        while arity ** (levels - 1) < T:
            levels += 1
        curve = tree_like(t, arity, levels, honaker_variances([float(levels) ** 2] * levels, arity))
        if best_uniform is None or curve.max() < best_uniform[1].max():
            best_uniform = (arity, curve)
    return {
        "binary tree": popcount(t) * float(L) ** 2,
        "honaker (binary)": tree_like(t, 2, L, honaker_variances([float(L) ** 2] * L, 2)),
        f"k-ary honaker, uniform (k={best_uniform[0]})": best_uniform[1],
        f"kary fitted (k={fit.arity}, L={fit.levels})": tree_like(
            t, fit.arity, fit.levels, pure_estimate_vars(np.asarray(fit.weights), fit.arity)),
    }


def _z() -> float:
    from beam_dp.core import analytic_gaussian_sigma

    return analytic_gaussian_sigma(EPS, DELTA, 1.0)


def check_against_mechanisms(T: int = 1024) -> None:
    """The vectorised curves equal the mechanisms' own noise_var (so the table is the mechanisms')."""
    t = range(1, T + 1)
    for law, curves, names in (("gaussian", gaussian_curves(T), ("honaker", "toeplitz", "blt", "tree")),
                               ("gamma", pure_curves(T), ("honaker", "kary", "tree"))):
        for name in names:
            mech = make_counter(name, horizon=T, noise=law, dim=1, epsilon=EPS, delta=DELTA if law == "gaussian" else 0.0,
                                clip_bound=0.5, calibration="analytic")
            got = np.array([mech.noise_var(s) for s in t])
            key = {"honaker": "honaker (binary)", "toeplitz": "toeplitz sqrt", "blt": "blt (4 buffers)",
                   "tree": "binary tree"}.get(name) or next(k for k in curves if k.startswith("kary fitted"))
            if law == "gaussian":
                z2 = (mech.sensitivity * _z()) ** 2
                ref = curves[key] * z2
            else:
                ref = curves[key] * 2 * (1 / EPS) ** 2  # d+1 = 2, Δ₂ = 1
            assert np.allclose(got, ref, rtol=1e-6), (law, name)


def empirical(T: int, runs: int) -> list[tuple[str, float, float]]:
    """(counter, empirical/analytic max variance, empirical/analytic mean variance) on zero data, fixed key."""
    noise = NoiseSource(bytes(range(32)))
    out = []
    for name, law in (("tree", "gaussian"), ("honaker", "gaussian"), ("toeplitz", "gaussian"), ("blt", "gaussian"),
                      ("tree", "gamma"), ("honaker", "gamma"), ("kary", "gamma")):
        mech = make_counter(name, horizon=T, noise=law, dim=1, epsilon=EPS, delta=DELTA if law == "gaussian" else 0.0,
                            clip_bound=0.5, calibration="analytic")
        err = np.empty((runs, T))
        for r in range(runs):
            state = mech.init_state(f"r{r}")
            for s in range(T):
                state, (rel,) = mech.step(state, None, noise)
                err[r, s] = rel.value[0]
        analytic = np.array([mech.noise_var(s) for s in range(1, T + 1)])
        emp = (err**2).mean(axis=0)
        out.append((f"{mech.name} ({law})", emp.max() / analytic.max(), emp.mean() / analytic.mean()))
    return out


def state_and_time(steps: int, dim: int = 8) -> list[tuple[str, int, float]]:
    noise, rng = NoiseSource(bytes(range(32))), np.random.default_rng(0)
    blocks = rng.normal(size=(steps, dim))
    out = []
    for name, law in (("tree", "gaussian"), ("honaker", "gaussian"), ("toeplitz", "gaussian"), ("blt", "gaussian"),
                      ("kary", "gamma")):
        mech = make_counter(name, horizon=steps, noise=law, dim=dim, epsilon=EPS,
                            delta=DELTA if law == "gaussian" else 0.0, clip_bound=1.0, calibration="analytic")
        state = mech.init_state("s")
        start = time.perf_counter()
        for b in blocks:
            state, _ = mech.step(state, b, noise)
        per_step = (time.perf_counter() - start) / steps * 1e6
        out.append((mech.name, len(mech.encode_state(state)), per_step))
    return out


def unbounded_growth() -> list[tuple[int, float, float]]:
    """BLT unbounded mode vs the hybrid tree (both exact, units z²Δ₂²) at and past the fit horizon."""
    blt = make_counter("blt", noise="gaussian", dim=1, epsilon=EPS, delta=DELTA, clip_bound=0.5)
    hybrid = HybridTreeSum(dim=1, epsilon=EPS, delta=DELTA, clip_bound=0.5, noise="gaussian", calibration="analytic")
    tree = BinaryTreeSum(dim=1, epsilon=EPS, delta=DELTA, clip_bound=0.5, noise="gaussian", calibration="analytic",
                         horizon=2**20)
    z2 = tree.noise_var(1) / (2**20).bit_length()  # one node's variance / L_T = z²Δ₂²
    rows = []
    for t in (2**10, 2**16, 2**20, UNBOUNDED_FIT_HORIZON, 4 * UNBOUNDED_FIT_HORIZON, 64 * UNBOUNDED_FIT_HORIZON):
        worst_t = t - 1 if t > 2 else t  # popcount-heavy step just below t for the tree
        rows.append((t, blt.noise_var(t) / z2, max(hybrid.noise_var(t), hybrid.noise_var(worst_t)) / z2))
    return rows


def print_blt_rows() -> None:
    """The square root's, the max-error BLT fit's and the mean-error fit's max / mean variance (z²Δ₂²)."""
    for k in (10, 12, 16, 20):
        curves = gaussian_curves(2**k)
        rows = (curves["toeplitz sqrt"], curves["blt (4 buffers)"], curves["blt (4 buffers, mean-error fit)"])
        print(f"T=2^{k}", *(f"{v.max():.3f} / {v.mean():.3f}" for v in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--figure", default=None)
    parser.add_argument("--blt-rows", action="store_true",
                        help="only the BLT fits' and the square root's max / mean variance at T = 2^10 .. 2^20")
    args = parser.parse_args()
    if args.blt_rows:
        print_blt_rows()
        return
    check_against_mechanisms()
    print("## exact per-step variance (max / mean over t in [1, T]); ratio = binary tree max / counter max\n")
    results = {}
    for fam, fn, unit in (("(eps, delta)", gaussian_curves, "z²Δ₂²"), ("pure eps", pure_curves, "(d+1)(Δ₂/ε)²")):
        print(f"### {fam}, units {unit}\n")
        print("| counter | " + " | ".join(f"T=2^{T.bit_length() - 1} max / mean (ratio)" for T in HORIZONS) + " |")
        print("|---|" + "---|" * len(HORIZONS))
        per_t = {T: fn(T) for T in HORIZONS}
        names = list(per_t[HORIZONS[-1]])  # the k-ary labels carry the fit of the largest T
        for i, label in enumerate(names):
            cells = []
            for T in HORIZONS:
                key = list(per_t[T])[i]
                curve, base = per_t[T][key], per_t[T]["binary tree"].max()
                cells.append(f"{curve.max():.1f} / {curve.mean():.1f} ({base / curve.max():.2f}×)")
                results.setdefault(fam, {}).setdefault(key.split(" (k=")[0], []).append(curve.max())
            print(f"| {label} | " + " | ".join(cells) + " |")
        if fam == "pure eps":
            cells = []
            for T in HORIZONS:
                m = smooth_binary_max(T)
                cells.append(f"{m:.1f} / – ({per_t[T]['binary tree'].max() / m:.2f}×)")
            print("| smooth binary (leading order, not shipped) | " + " | ".join(cells) + " |")
        print()
    runs, steps = (2000, 4000) if args.full else (400, 1000)
    print(f"## empirical / analytic variance at T = 256, {runs} runs (fixed key)\n")
    print("| counter | max ratio | mean ratio |\n|---|---|---|")
    for name, mx, mean in empirical(256, runs):
        print(f"| {name} | {mx:.3f} | {mean:.3f} |")
    print(f"\n## state per key and time per step (d = 8, {steps} steps)\n")
    print("| counter | encoded state (bytes) | µs / step |\n|---|---|---|")
    for name, size, us in state_and_time(steps):
        print(f"| {name} | {size} | {us:.0f} |")
    print("\n## unbounded mode: BLT (fit 2^24, sensitivity over all steps) vs hybrid tree, units z²Δ₂²\n")
    print("| t | blt unbounded | hybrid tree (max of t, t−1) |\n|---|---|---|")
    for t, b, h in unbounded_growth():
        print(f"| 2^{t.bit_length() - 1} | {b:.1f} | {h:.1f} |")
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, fam in zip(axes, results):
            for name, vals in results[fam].items():
                ax.loglog(HORIZONS, vals, marker="o", label=name)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{fam}: max per-step variance")
            ax.set_xlabel("horizon T")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        axes[0].set_ylabel("units z²Δ₂² (left), (d+1)(Δ₂/ε)² (right)")
        fig.tight_layout()
        fig.savefig(args.figure, dpi=120)
        print(f"\nfigure: {args.figure}")


if __name__ == "__main__":
    main()
