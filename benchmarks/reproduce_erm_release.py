"""Reproduce the ERM-release experiments (seed 000, Watson et al.) qualitatively.

Runs the pure mechanisms (no Beam) over a shuffled stream and records test accuracy of every
release: continual cumulative release (Alg. 2 prefix base + Alg. 4), the independent per-block
baseline, sliding-window release (Alg. 5), each with pure-ε K-norm noise and with the (ε, δ)
Gaussian variant, against the same algorithm without noise (the non-private model).

Default: scikit-learn's digits (1 797 images, 64 features, 10 classes; 75 % stream, 25 % test),
b0 = w0 = 64, B = 8·b0, w = 7·w0, λ ∈ {0.1, 1} (λ = 10 over-regularises 64-element blocks), ε ∈ {0.1, 1, 10, 100}, 2 repetitions: about a
minute on 2 cores. ``--data mnist.npz`` runs the paper's MNIST settings (b0 = w0 = 1024,
B = 8·b0, w = 7·w0, λ ∈ {1, 10}, stream of 20 000 training images, 10 000 test images); add ``--reps 4`` for
the paper's repetitions. Features are pixel/255 (MNIST) or /16 (digits), clipped to L2 norm 1.

    nice -n 10 .venv/bin/python benchmarks/reproduce_erm_release.py
    nice -n 10 .venv/bin/python benchmarks/reproduce_erm_release.py --data /work/shared/data/mnist/mnist.npz
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import platform
import time
from pathlib import Path

import numpy as np

from beam_dp.core import NoiseSource
from beam_dp.io.models import load_model
from beam_dp.mechanisms.erm import (ContinualReleaseMechanism, LabelledRows, SlidingWindowMechanism,
                                    SoftmaxRegression)
from beam_dp.testing import ZeroNoise

log = logging.getLogger("reproduce_erm_release")


def load(data: str | None, stream_len: int | None):
    if data:
        with np.load(data, allow_pickle=False) as z:
            Xtr, ytr, Xte, yte = z["x_train"], z["y_train"], z["x_test"], z["y_test"]
        Xtr = Xtr.reshape(len(Xtr), -1) / 255.0
        Xte = Xte.reshape(len(Xte), -1) / 255.0
        name = "mnist"
    else:
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        X = X / 16.0
        perm = np.random.default_rng(0).permutation(len(X))
        cut = int(0.75 * len(X))
        Xtr, ytr, Xte, yte = X[perm[:cut]], y[perm[:cut]], X[perm[cut:]], y[perm[cut:]]
        name = "digits"
    perm = np.random.default_rng(1).permutation(len(Xtr))  # the stream: shuffled training images
    Xtr, ytr = Xtr[perm], ytr[perm].astype(np.int64)
    if stream_len:
        Xtr, ytr = Xtr[:stream_len], ytr[:stream_len]
    return name, Xtr, ytr, Xte, yte.astype(np.int64)


def accuracy_curve(mech, X, y, Xte, yte, unit, noise) -> list[tuple[int, float]]:
    state = mech.init_state("stream")
    out = []
    for start in range(0, len(X) - unit + 1, unit):
        state, releases = mech.step(state, LabelledRows(X[start:start + unit], y[start:start + unit]), noise)
        for r in releases:
            out.append((start + unit, load_model(r).score(Xte, yte)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="path to mnist.npz (Keras layout); default: scikit-learn digits")
    ap.add_argument("--b0", type=int, help="update block b0 (= w0); default 64 (digits) / 1024 (MNIST)")
    ap.add_argument("--stream", type=int, help="stream length; default all (digits) / 20000 (MNIST)")
    ap.add_argument("--eps", type=float, nargs="+", default=[0.1, 1.0, 10.0, 100.0])
    ap.add_argument("--lams", type=float, nargs="+", help="λ values; default 0.1 1 (digits) / 1 10 (MNIST)")
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--algorithms", nargs="+", default=["continual", "independent", "sliding"])
    ap.add_argument("--figure", default="docs/figures/erm_{name}.png")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True)
    name, X, y, Xte, yte = load(args.data, args.stream or (20000 if args.data else None))
    b0 = args.b0 or (1024 if args.data else 64)
    args.lams = args.lams or ([1.0, 10.0] if args.data else [0.1, 1.0])
    model = SoftmaxRegression(n_features=X.shape[1], clip_bound=1.0, n_classes=10)
    log.info("%s: stream %d, test %d, d = %d, b0 = w0 = %d, B = %d, w = %d; %s, %s, %d cpus",
             name, len(X), len(Xte), model.dim, b0, 8 * b0, 7 * b0, platform.machine(), platform.python_version(),
             os.cpu_count())

    def build(alg, lam, eps, law):
        kw = dict(model=model, lam=lam, epsilon=eps, noise=law, delta=args.delta if law == "gaussian" else 0.0)
        if alg == "continual":
            return ContinualReleaseMechanism(update=b0, base=8 * b0, **kw)
        if alg == "independent":
            return ContinualReleaseMechanism(update=b0, base=8 * b0, variant="independent", **kw)
        return SlidingWindowMechanism(block=b0, levels=3, **kw)

    results = {}
    t0 = time.time()
    for alg, lam in itertools.product(args.algorithms, args.lams):
        results[(alg, lam, "non-private", None)] = [accuracy_curve(build(alg, lam, 1.0, "gamma"), X, y, Xte, yte,
                                                                   b0, ZeroNoise())]
        for eps, law in itertools.product(args.eps, ("gamma", "gaussian")):
            curves = [accuracy_curve(build(alg, lam, eps, law), X, y, Xte, yte, b0,
                                     NoiseSource(rep.to_bytes(4, "little") * 8)) for rep in range(args.reps)]
            results[(alg, lam, law, eps)] = curves
            log.info("%-11s λ=%-4g %-8s ε=%-5g final acc median %.3f  (%.0fs)", alg, lam, law, eps,
                     np.median([c[-1][1] for c in curves]), time.time() - t0)

    print(f"\n| algorithm | λ | noise | ε | median final accuracy | median mean accuracy over releases |")
    print("|---|---|---|---|---|---|")
    for (alg, lam, law, eps), curves in results.items():
        final = np.median([c[-1][1] for c in curves])
        mean = np.median([np.mean([a for _, a in c]) for c in curves])
        label = "non-private" if law == "non-private" else ("pure ε (K-norm)" if law == "gamma" else f"(ε, {args.delta:g}) Gaussian")
        print(f"| {alg} | {lam:g} | {label} | {'–' if eps is None else f'{eps:g}'} | {final:.3f} | {mean:.3f} |")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(args.algorithms), 2, figsize=(11, 3.4 * len(args.algorithms)), squeeze=False)
    for row, alg in enumerate(args.algorithms):
        for col, law in enumerate(("gamma", "gaussian")):
            ax = axes[row][col]
            lam = args.lams[0]
            t, acc = zip(*results[(alg, lam, "non-private", None)][0])
            ax.plot(t, acc, "k-", label="non-private")
            for eps in args.eps:
                curves = results[(alg, lam, law, eps)]
                t = [p[0] for p in curves[0]]
                accs = np.array([[p[1] for p in c] for c in curves])
                ax.plot(t, np.median(accs, axis=0), marker=".", label=f"ε={eps:g}")
                ax.fill_between(t, np.percentile(accs, 25, axis=0), np.percentile(accs, 75, axis=0), alpha=0.2)
            ax.set_title(f"{name}: {alg}, λ={lam:g}, " + ("pure ε K-norm" if law == "gamma" else f"Gaussian δ={args.delta:g}"))
            ax.set_xlabel("elements seen t")
            ax.set_ylabel("test accuracy")
            ax.set_ylim(0, 1)
            ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(args.figure.format(name=name))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    log.info("figure written to %s (%.0fs total)", path, time.time() - t0)


if __name__ == "__main__":
    main()
