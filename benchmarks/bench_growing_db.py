"""Growing-database linear queries: accuracy, hard-query count and throughput (docs/growing_db.md).

Compares, at the same total privacy budget, on a stream of arrivals with queries asked every
``--every`` arrivals:

* PMWG (pure ε, default ξ_n), PMWG ((ε, δ), default ξ_n) and PMWG ((ε, δ), ξ_n overridden: less
  noise, the accountant pauses when the budget is spent);
* BBScheduler(LaplaceHistogram), pure ε;
* fresh Laplace per query: query k of Q (Q known in advance) at size t gets Lap(Q/(ε t)) (basic
  composition; a linear query has sensitivity 1/t).

Datasets: ``synthetic`` (a drifting mixture over N = 2^10 cells) and ``digits`` (scikit-learn's
bundled handwritten digits: label × three bucketed pixels, N = 640; rows in a seeded order with a
drift: the labels arrive roughly in order). ``--data FILE.csv`` uses a CSV of categorical columns
instead (every distinct value of each column is a category; the universe is the product).

Usage::

    nice -n 10 .venv/bin/python benchmarks/bench_growing_db.py            # default (a few minutes)
    nice -n 10 .venv/bin/python benchmarks/bench_growing_db.py --quick    # seconds
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import numpy as np

from beam_dp.core import NoiseSource
from beam_dp.core.accounting.growing_db import hard_query_bound, worst_case_xi_n
from beam_dp.mechanisms.growing_db.base import Query
from beam_dp.mechanisms.growing_db.pmwg import PMWG
from beam_dp.mechanisms.growing_db.schedulers import BBImprover, BBScheduler, LaplaceHistogram
from beam_dp.mechanisms.growing_db.universe import Bucketed, Categorical, Universe

ROOT = Path(__file__).resolve().parents[1]


def synthetic(N: int, T: int, rng: np.random.Generator) -> np.ndarray:
    """T arrivals whose distribution drifts: a bump whose centre moves across the universe."""
    centres = np.linspace(0.2, 0.8, T) * N
    return np.clip(np.round(centres + rng.normal(0, N / 16, T)), 0, N - 1).astype(np.int64)


def digits(rng: np.random.Generator) -> tuple[Universe, np.ndarray]:
    from sklearn.datasets import load_digits

    data = load_digits()
    edges = (0, 4, 8, 12, 17)
    universe = Universe([Categorical("label", tuple(range(10))), Bucketed("p21", edges), Bucketed("p36", edges),
                         Bucketed("p43", edges)])
    order = np.argsort(data.target + rng.uniform(0, 4, len(data.target)), kind="stable")  # drifting labels
    X, y = data.data[order], data.target[order]
    index, valid = universe.encode({"label": y.tolist(), "p21": X[:, 21], "p36": X[:, 36], "p43": X[:, 43]})
    assert valid.all()
    return universe, index


def from_csv(path: str) -> tuple[Universe, np.ndarray]:
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    names = list(rows[0])
    fields = [Categorical(name, tuple(sorted({r[name] for r in rows}))) for name in names]
    universe = Universe(fields)
    index, valid = universe.encode({name: [r[name] for r in rows] for name in names})
    return universe, index[valid]


def random_queries(N: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Counting queries over random contiguous ranges and random subsets (half each)."""
    out = []
    for j in range(k):
        if j % 2:
            lo = int(rng.integers(0, N))
            hi = min(N, lo + int(rng.integers(N // 16, N // 2)))
            f = np.zeros(N)
            f[lo:hi] = 1.0
        else:
            f = (rng.random(N) < 0.3).astype(float)
        out.append(f)
    return out


def run_accuracy(name: str, N: int, stream: np.ndarray, n: int, every: int, per_step: int, eps: float,
                 delta: float, alpha: float, seeds: int, rng: np.random.Generator) -> dict:
    T = len(stream)
    sizes = list(range(n, T + 1, every))
    queries = {t: random_queries(N, per_step, rng) for t in sizes}
    Q = len(sizes) * per_step
    lh = LaplaceHistogram(N)
    p_tuned = 0.02
    methods = {
        "PMWG ε": lambda: PMWG(universe_size=N, n=n, epsilon=eps, alpha=alpha),
        "PMWG (ε,δ)": lambda: PMWG(universe_size=N, n=n, epsilon=eps, alpha=alpha, delta=delta),
        f"PMWG (ε,δ), ξ_n={p_tuned}": lambda: PMWG(universe_size=N, n=n, epsilon=eps, alpha=alpha, delta=delta,
                                                   xi_n=p_tuned),
        "BBScheduler(LaplaceHistogram) ε": lambda: BBScheduler(lh, universe_size=N, n=n, epsilon=eps),
    }
    curves: dict[str, list] = {m: [] for m in list(methods) + ["fresh Laplace ε"]}
    extra: dict[str, dict] = {}
    for seed in range(seeds):
        noise = NoiseSource(bytes([seed + 1]) * 32)
        for label, build in methods.items():
            mech = build()
            state = mech.init_state(f"{name}-{seed}")
            errs, done = [], 0
            for t in sizes:
                state, _ = mech.absorb(state, stream[done:t], noise)
                done = t
                truth_counts = state.counts
                step_errs = []
                for j, f in enumerate(queries[t]):
                    state, rel = mech.answer(state, Query(t, f"q{j}", f), noise)
                    step_errs.append(abs(rel[-1].value[0] - f @ truth_counts / t))
                errs.append(step_errs)
            curves[label].append(errs)
            if isinstance(mech, PMWG) and seed == 0:
                extra[label] = {"hard": state.hard_count, "H(T)": float(hard_query_bound(T, N, n, alpha)[0]),
                                "epsilon_spent": mech.sub.spent(state.total), "beta_bound": state.beta_bound,
                                "xi_n": mech.xi_n, "segments": int(state.segment_index)}
        gen = noise.generator("fresh", "bench")
        errs = []
        for t in sizes:
            counts = np.bincount(stream[:t], minlength=N)
            errs.append([abs(gen.laplace(0, Q / (eps * t))) for _ in queries[t]])
            del counts
        curves["fresh Laplace ε"].append(errs)
    summary = {}
    for label, runs in curves.items():
        arr = np.array(runs)  # seeds × steps × queries
        summary[label] = {"max_abs_error": float(arr.max()), "mean_abs_error": float(arr.mean()),
                          "mean_abs_error_last_quarter": float(arr[:, -max(1, len(sizes) // 4):].mean()),
                          "curve_mean": arr.mean(axis=(0, 2)).tolist(), "curve_max": arr.max(axis=2).mean(0).tolist()}
    return {"dataset": name, "N": N, "n": n, "T": T, "every": every, "per_step": per_step, "queries": Q,
            "epsilon": eps, "delta": delta, "alpha": alpha, "seeds": seeds, "sizes": sizes, "methods": summary,
            "pmwg": extra}


# error vs n: the mechanisms at their defaults, and the exponent of n their theorems give (up to logs)
RATE_METHODS = {
    "PMWG ε (default ξ_n)": (lambda N, n, eps, delta: PMWG(universe_size=N, n=n, epsilon=eps, alpha=0.2), -1 / 3),
    "PMWG ε (default ξ_n, α = 0.2·(1000/n)^(1/3))": (lambda N, n, eps, delta: PMWG(
        universe_size=N, n=n, epsilon=eps, alpha=min(1.0, 0.2 * (1000 / n) ** (1 / 3))), -1 / 3),
    "PMWG ε (worst-case ξ_n)": (lambda N, n, eps, delta: PMWG(universe_size=N, n=n, epsilon=eps, alpha=0.2,
                                                                xi_n=worst_case_xi_n(N, n, eps, 0.2)), -1 / 3),
    "BBScheduler(LaplaceHistogram) ε": (lambda N, n, eps, delta: BBScheduler(LaplaceHistogram(N), universe_size=N,
                                                                              n=n, epsilon=eps), -1 / 3),
    "BBScheduler(LaplaceHistogram) (ε,δ)": (lambda N, n, eps, delta: BBScheduler(
        LaplaceHistogram(N), universe_size=N, n=n, epsilon=eps, delta=delta), -0.4),
    "BBImprover(LaplaceHistogram) (ε,δ)": (lambda N, n, eps, delta: BBImprover(
        LaplaceHistogram(N), universe_size=N, n=n, epsilon=eps, delta=delta), -0.5),
}


def answer_errors(mech, stream: np.ndarray, queries: dict[int, list[np.ndarray]], noise: NoiseSource, name: str):
    """Absorb ``stream`` up to each size t of ``queries`` (ascending) and answer its queries there
    (mechanism stream ``name``); returns the final state and every |answer − f(x_t)|."""
    state, done, errs = mech.init_state(name), 0, []
    for t in sorted(queries):
        state, _ = mech.absorb(state, stream[done:t], noise)
        done = t
        for j, f in enumerate(queries[t]):
            state, rel = mech.answer(state, Query(t, f"q{j}", f), noise)
            errs.append(abs(rel[-1].value[0] - f @ state.counts / t))
    return state, errs


def run_rates(N: int, ns: list[int], eps: float, delta: float, seeds: int, per_step: int = 5) -> dict:
    """Mean |error| of answers asked at sizes t ∈ [n, 2n] (11 sizes, ``per_step`` random counting
    queries each) on the drifting synthetic stream, per start size n; the log-log slope against n is
    fitted by least squares and compared with the theorem's exponent (PMWG Thm 5 and BBScheduler
    Thm 9 with p = 1: −1/3 (pure), −p/(1.5p+1) = −0.4 ((ε, δ)); BBImprover α_t = Õ(1/(ε√t)): −1/2)."""
    out = {label: {"theory_slope": slope, "mean_abs_error": []} for label, (_, slope) in RATE_METHODS.items()}
    for n in ns:
        rng = np.random.default_rng(n)
        stream = synthetic(N, 2 * n, rng)
        sizes = [n + k * n // 10 for k in range(11)]
        queries = {t: random_queries(N, per_step, rng) for t in sizes}
        for label, (build, _) in RATE_METHODS.items():
            errs = []
            for seed in range(seeds):
                errs += answer_errors(build(N, n, eps, delta), stream, queries, NoiseSource(bytes([seed + 1]) * 32),
                                      f"rate-{n}-{seed}")[1]
            out[label]["mean_abs_error"].append(float(np.mean(errs)))
    for res in out.values():
        res["fitted_slope"] = float(np.polyfit(np.log(ns), np.log(res["mean_abs_error"]), 1)[0])
        res["fitted_slope_large_n"] = float(np.polyfit(np.log(ns[-5:]), np.log(res["mean_abs_error"][-5:]), 1)[0])
    return {"N": N, "ns": ns, "epsilon": eps, "delta": delta, "seeds": seeds, "methods": out}


def choose_segments(ks=(4, 8, 16, 32, 64, 128, 512), seeds: int = 2) -> None:
    """How the default K of ``planned_xi_n`` was chosen: mean |error| of PMWG on the public synthetic
    stream (N = 2^10, n = 1 000, T = 20 000, α = 0.2, ε = 1, 5 counting queries every 500 arrivals)
    for each K, and for the worst-case noise function (K = None)."""
    N, n, T = 1 << 10, 1000, 20000
    rng = np.random.default_rng(2024)
    stream = synthetic(N, T, rng)
    qs = {t: random_queries(N, 5, rng) for t in range(n, T + 1, 500)}
    for delta in (0.0, 1e-6):
        for k in (None, *ks):
            errs = []
            for seed in range(seeds):
                noise = NoiseSource(bytes([seed + 1]) * 32)
                kw = dict(xi_n=worst_case_xi_n(N, n, 1.0, 0.2, delta)) if k is None else dict(segments=k)
                mech = PMWG(universe_size=N, n=n, epsilon=1.0, alpha=0.2, delta=delta, **kw)
                state, run_errs = answer_errors(mech, stream, qs, noise, "k")
                errs += run_errs
            print(f"δ={delta:g} K={k or 'worst case'} ξ_n={mech.xi_n:.4g} mean |error| {np.mean(errs):.4f} "
                  f"hard={state.hard_count} ε spent={mech.sub.spent(state.total):.3f}", flush=True)


def plot_rates(rates: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = np.array(rates["ns"], dtype=float)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, res in rates["methods"].items():
        err = np.array(res["mean_abs_error"])
        line, = ax.plot(ns, err, "o-", label=f"{label}: slope {res['fitted_slope']:.2f}, "
                        f"large n {res['fitted_slope_large_n']:.2f} (theory {res['theory_slope']:.2f})")
        ax.plot(ns, err[0] * (ns / ns[0]) ** res["theory_slope"], ":", color=line.get_color(), lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("start size n (queries at t ∈ [n, 2n])")
    ax.set_ylabel("mean |answer − f(x_t)|")
    ax.set_title(f"error vs n: N={rates['N']}, ε={rates['epsilon']}, δ={rates['delta']:g}, {rates['seeds']} keys "
                 "(dotted: theory slope)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run_throughput(N: int, arrivals: int, queries: int) -> dict:
    rng = np.random.default_rng(0)
    noise = NoiseSource(bytes(range(32)))
    out = {}
    for label, mech in {
        "PMWG (ε,δ)": PMWG(universe_size=N, n=100, epsilon=1.0, alpha=0.3, delta=1e-6),
        "BBScheduler(LaplaceHistogram)": BBScheduler(LaplaceHistogram(N), universe_size=N, n=100, epsilon=1.0),
    }.items():
        state, _ = mech.absorb(mech.init_state("tp"), rng.integers(0, N, 100), noise)
        elements = rng.integers(0, N, arrivals)
        start = time.perf_counter()
        for v in elements:  # one arrival at a time: the worst case (a chunk is one numpy operation)
            state, _ = mech.absorb(state, np.array([v]), noise)
        arr_rate = arrivals / (time.perf_counter() - start)
        fs = [(rng.random(N) < 0.3).astype(float) for _ in range(queries)]
        start = time.perf_counter()
        for j, f in enumerate(fs):
            state, _ = mech.answer(state, Query(state.t, f"q{j}", f), noise)
        q_rate = queries / (time.perf_counter() - start)
        chunk = rng.integers(0, N, 100_000)
        start = time.perf_counter()
        mech.absorb(state, chunk, noise)
        out[label] = {"arrivals_per_s": arr_rate, "queries_per_s": q_rate,
                      "bulk_arrivals_per_s": len(chunk) / (time.perf_counter() - start)}
    return out


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, res in zip(axes[0], results):
        for label, s in res["methods"].items():
            ax.plot(res["sizes"], s["curve_mean"], label=label)
        ax.set_yscale("log")
        ax.set_xlabel("database size t")
        ax.set_ylabel("mean |answer − f(x_t)|")
        ax.set_title(f"{res['dataset']}: N={res['N']}, n={res['n']}, ε={res['epsilon']}, δ={res['delta']:g}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny settings (seconds)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--data", help="CSV of categorical columns to use instead of scikit-learn's digits")
    ap.add_argument("--out", default=str(ROOT / "docs" / "figures" / "growing_db_error.png"))
    ap.add_argument("--json", default=None, help="write the results as JSON here")
    ap.add_argument("--rates-only", action="store_true", help="only the error-vs-n rates (figure growing_db_rates.png)")
    ap.add_argument("--rates-out", default=str(ROOT / "docs" / "figures" / "growing_db_rates.png"))
    ap.add_argument("--choose-segments", action="store_true", help="only the table that chose PMWG's default K")
    args = ap.parse_args()
    if args.choose_segments:
        choose_segments()
        return
    rates = run_rates(1 << 8, [250 * 2**k for k in range(11)] if not args.quick else [250, 500, 1000, 2000, 4000],
                      1.0, 1e-6, 1 if args.quick else args.seeds)
    print(f"\nerror vs n (N={rates['N']}, ε={rates['epsilon']}, δ={rates['delta']:g}, queries at t ∈ [n, 2n], "
          f"{rates['seeds']} keys):")
    print("| method | " + " | ".join(f"n={n}" for n in rates["ns"]) + " | fitted slope (all n) | (5 largest n) | theory slope |")
    print("|---" * (len(rates["ns"]) + 4) + "|")
    for label, res in rates["methods"].items():
        print(f"| {label} | " + " | ".join(f"{e:.4f}" for e in res["mean_abs_error"]) +
              f" | {res['fitted_slope']:.3f} | {res['fitted_slope_large_n']:.3f} | {res['theory_slope']:.3f} |")
    plot_rates(rates, Path(args.rates_out))
    print(f"figure: {args.rates_out}")
    if args.rates_only:
        return
    rng = np.random.default_rng(2024)
    seeds = 1 if args.quick else args.seeds
    results = []
    T = 5_000 if args.quick else 40_000
    results.append(run_accuracy("synthetic", 1 << 10, synthetic(1 << 10, T, rng), n=1_000, every=T // 40,
                                per_step=5, eps=1.0, delta=1e-6, alpha=0.2, seeds=seeds, rng=rng))
    universe, stream = from_csv(args.data) if args.data else digits(rng)
    results.append(run_accuracy(Path(args.data).name if args.data else "digits", universe.size, stream,
                                n=len(stream) // 6, every=max(1, len(stream) // 30), per_step=5, eps=1.0,
                                delta=1e-6, alpha=0.2, seeds=seeds, rng=rng))
    arrivals, queries = (200, 50) if args.quick else (2_000, 500)
    throughput = {f"N=2^{k}": run_throughput(1 << k, arrivals, queries) for k in (10, 16)}
    for res in results:
        print(f"\n{res['dataset']}: N={res['N']} n={res['n']} T={res['T']} queries={res['queries']} "
              f"ε={res['epsilon']} δ={res['delta']:g} α={res['alpha']} seeds={res['seeds']}")
        print(f"  {'method':40s} {'max err':>9s} {'mean err':>9s} {'mean err (last 1/4)':>20s}")
        for label, s in res["methods"].items():
            print(f"  {label:40s} {s['max_abs_error']:9.4f} {s['mean_abs_error']:9.4f} "
                  f"{s['mean_abs_error_last_quarter']:20.4f}")
        for label, e in res["pmwg"].items():
            print(f"  {label}: hard={e['hard']} H(T)={e['H(T)']:.0f} segments={e['segments']} "
                  f"ε spent={e['epsilon_spent']:.3f} ξ_n={e['xi_n']:.4g} beta_bound={e['beta_bound']:.3g}")
    print("\nthroughput (one arrival at a time; queries are dense 0/1 vectors):")
    for size, rows in throughput.items():
        for label, r in rows.items():
            print(f"  {size:7s} {label:32s} arrivals/s {r['arrivals_per_s']:10.0f}  queries/s {r['queries_per_s']:9.0f}"
                  f"  bulk arrivals/s {r['bulk_arrivals_per_s']:12.0f}")
    plot(results, Path(args.out))
    print(f"\nfigure: {args.out}")
    if args.json:
        Path(args.json).write_text(json.dumps({"accuracy": results, "throughput": throughput}, indent=1))


if __name__ == "__main__":
    main()
