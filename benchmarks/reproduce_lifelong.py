"""Reproduce Lai et al. (Lifelong DP) on permuted MNIST and a HAPT activity task sequence, on CPU or GPU.

Learners: L2DP-ML (the paper's claim) with (``l2dp``) and without (``l2dp-nobn``) the encoder
normalisation, NaiveGaussian (DP-SGD, ε/m per task), the sound bounded-participation DP-SGD + A-GEM,
and non-private A-GEM, at ε ∈ {0.5, 1, 2} by default; ``--seeds`` repeats every run (data,
permutations and noise key change with the seed) and reports mean ± sd. With ≥ 3 ε values the
sanity rule of issue 17 is checked per learner (does accuracy rise with ε?) and ``--sweep-figure``
draws A_m against ε. Metrics: the
accuracy matrix a[l, t], average accuracy A_τ after each task and average forgetting F_m.

Default run (a few minutes on 2 CPU cores): permuted MNIST with 10 tasks of 1,000 training / 500 test
images each, and HAPT with 5 tasks (groups of 6 subjects), 1 epoch, a dense network (β = 64, G = 64
ReLU → 32 clipped). The paper's setting: ``--tasks 20 --train-per-task 0`` (all 60,000 images per task)
and more epochs; the paper's conv architecture is not implemented (dense layers only).

    nice -n 10 .venv/bin/python benchmarks/reproduce_lifelong.py --data /work/shared/data
    nice -n 19 .venv/bin/python benchmarks/reproduce_lifelong.py --data /work/shared/data \
        --eps 0.01 0.1 1 10 100 1000 --seeds 0 1 2 --learners l2dp l2dp-nobn bounded agem --sweep-figure

The data are read from ``--data`` (never copied): ``mnist/mnist.npz`` and ``uci_hapt/hapt_raw.npz``
(HAPT: non-commercial licence). Prints tables, wall time and device; writes JSON and figures.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

from beam_dp.core import NoiseSource
from beam_dp.mechanisms.lifelong import (
    AGEMConfig,
    BoundedAGEMConfig,
    L2DPConfig,
    NaiveGaussianConfig,
    TaskData,
    average_accuracy,
    average_forgetting,
    curve_p_value,
)
from beam_dp.mechanisms.lifelong.factory import build_learner

PAPER = {"pmnist_eps0.5_l2dp": 47.73, "pmnist_eps0.5_naive": 10.43,
         "pmnist_forgetting": {"l2dp": {0.5: 0.305, 1.0: 0.278, 2.0: 0.237},
                               "naive": {0.5: 0.012, 1.0: 0.015, 2.0: 0.017}, "agem": 0.162}}


def permuted_mnist(path: Path, n_tasks: int, train_per_task: int, test_per_task: int, seed: int):
    data = np.load(path / "mnist" / "mnist.npz", allow_pickle=False)
    x_tr = (data["x_train"].reshape(-1, 784) / np.float32(127.5) - np.float32(1.0)).astype(np.float32)  # 20 full
    x_te = (data["x_test"].reshape(-1, 784) / np.float32(127.5) - np.float32(1.0)).astype(np.float32)  # tasks: 4 GB
    y_tr, y_te = data["y_train"].astype(np.int64), data["y_test"].astype(np.int64)
    rng = np.random.default_rng(seed)
    tasks, evals = [], {}
    for t in range(n_tasks):
        perm = rng.permutation(784)
        tr = rng.permutation(len(y_tr))[: train_per_task or None]
        te = rng.permutation(len(y_te))[: test_per_task or None]
        tasks.append(TaskData(str(t), x_tr[tr][:, perm], y_tr[tr]))
        evals[str(t)] = (x_te[te][:, perm], y_te[te])
    return tasks, evals, 10


def hapt_tasks(path: Path, n_groups: int, seed: int, window: int = 100, stride: int = 50):
    """Tasks = groups of subjects; 6 basic activities; windows of 100 accelerometer samples × 3 axes
    (z-scored with the task's training statistics, clipped to [−2, 2], scaled to [−1, 1]); 15% test."""
    d = np.load(path / "uci_hapt" / "hapt_raw.npz", allow_pickle=False)
    acc, label, user, exp = d["acc"], d["label"].astype(np.int64), d["user"].astype(np.int64), d["experiment"]
    starts = np.arange(0, len(label) - window, stride)
    idx = starts[:, None] + np.arange(window)[None, :]
    lab = label[idx]
    same = (lab == lab[:, :1]).all(axis=1) & (exp[idx] == exp[idx][:, :1]).all(axis=1) & (lab[:, 0] >= 1) & (lab[:, 0] <= 6)
    idx, y, who = idx[same], lab[same, 0] - 1, user[idx[same, 0]]
    users = np.arange(1, 31)
    groups = np.array_split(users, n_groups)
    rng = np.random.default_rng(seed)
    tasks, evals = [], {}
    for t, g in enumerate(groups):
        rows = np.flatnonzero(np.isin(who, g))
        rows = rows[rng.permutation(len(rows))]
        cut = int(0.85 * len(rows))
        tr, te = rows[:cut], rows[cut:]
        w = acc[idx]  # (n, window, 3)
        mean, std = w[tr].mean(axis=(0, 1)), w[tr].std(axis=(0, 1)) + 1e-8
        def prep(r):
            return (np.clip((w[r] - mean) / std, -2, 2) / 2).transpose(0, 2, 1).reshape(len(r), -1)
        tasks.append(TaskData(str(t), prep(tr), y[tr]))
        evals[str(t)] = (prep(te), y[te])
    return tasks, evals, 6


LEARNERS = ("l2dp", "l2dp-nobn", "naive", "bounded", "agem")


def make_config(kind: str, eps: float, common: dict, n_tasks: int):
    """A learner's config; ``common["task_size"]`` (the public task sizes, here the benchmark's own choice)
    and ``common["accountant"]`` go to the DP-SGD learners only."""
    if kind in ("l2dp", "l2dp-nobn", "agem"):
        common = {k: v for k, v in common.items() if k not in ("task_size", "accountant")}
    if kind in ("l2dp", "l2dp-nobn"):
        return L2DPConfig(**common, epsilon=eps, encoder_batch_norm=kind == "l2dp")
    if kind == "naive":
        return NaiveGaussianConfig(**common, epsilon=eps, delta=1e-5, num_tasks=n_tasks, clip_norm=0.1)
    if kind == "bounded":
        return BoundedAGEMConfig(**common, epsilon=eps, delta=1e-5, clip_norm=0.1, memory_uses=100, memory_share=0.3)
    return AGEMConfig(**common)


def run_learner(config, tasks, key: bytes):
    learner = build_learner(config)
    state = learner.init_state("bench")
    noise = NoiseSource(key)
    m = len(tasks)
    acc = np.zeros((m, m))
    for seen, task in enumerate(tasks):
        state, (release,) = learner.step(state, task, noise)
        for t in range(seen + 1):
            acc[seen, t] = release.meta["accuracy"][str(t)]
    return acc, release, str(learner.device)


def run_dataset(name, tasks, evals, n_classes, args, seed):
    key = bytes([seed]) * 32
    common = dict(input_dim=tasks[0].x.shape[1], n_classes=n_classes, hidden=args.hidden, g_layers=(64, 32),
                  batch_size=args.batch, learning_rate=args.lr, epochs=args.epochs, task_ids=tuple(t.task_id for t in tasks),
                  eval_sets=evals, device=args.device, dtype=args.dtype,
                  task_size={t.task_id: len(t) for t in tasks},  # sizes the script chose: public
                  accountant=args.accountant)
    results = {}
    for kind in args.learners:
        for eps in ([None] if kind == "agem" else args.eps):
            t0 = time.time()
            acc, release, device = run_learner(make_config(kind, eps, common, len(tasks)), tasks, key)
            label = kind if eps is None else f"{kind}@{eps:g}"
            results[label] = {"seed": seed, "acc": acc.tolist(), "A": average_accuracy(acc).tolist(), "F": average_forgetting(acc),
                              "epsilon_spent": release.epsilon_spent, "delta_spent": release.delta_spent,
                              **{k: release.meta.get(k) for k in ("accountant", "noise_multiplier",
                                                                   "noise_multiplier_memory")},
                              "seconds": time.time() - t0, "device": device}
            print(f"{name:7s} {label:14s} A_m={100 * results[label]['A'][-1]:6.2f}%  F_m={results[label]['F']:.3f}  "
                  f"eps_spent={release.epsilon_spent:.3g}  {results[label]['seconds']:.1f}s on {device}", flush=True)
    return results


def figure(results, name, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eps_values = sorted({float(k.split("@")[1]) for k in results if "@" in k})
    fig, axes = plt.subplots(1, len(eps_values), figsize=(4.2 * len(eps_values), 3.4), sharey=True)
    for ax, eps in zip(np.atleast_1d(axes), eps_values):
        for label, res in results.items():
            if label.endswith(f"@{eps:g}") or "@" not in label:
                ax.plot(range(1, len(res["A"]) + 1), 100 * np.array(res["A"]), marker="o", ms=3, label=label.split("@")[0])
        ax.set_title(f"{name}, ε = {eps:g}")
        ax.set_xlabel("tasks trained")
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("average accuracy A_τ (%)")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def aggregate(per_seed: list[dict]) -> dict:
    """Mean and sample standard deviation over seeds of A_m (%), F_m and seconds, per learner label."""
    out = {}
    for label in per_seed[0]:
        a = np.array([100 * r[label]["A"][-1] for r in per_seed])
        f = np.array([r[label]["F"] for r in per_seed])
        out[label] = {"A_mean": float(a.mean()), "A_sd": float(a.std(ddof=1)) if len(a) > 1 else 0.0,
                      "A_runs": a.tolist(), "F_mean": float(f.mean()),
                      "epsilon_spent": per_seed[0][label]["epsilon_spent"],
                      "seconds": float(np.mean([r[label]["seconds"] for r in per_seed]))}
    return out


def sanity(agg: dict) -> dict:
    """The rule of issue 17: a DP learner's accuracy must rise with ε. Per learner with ≥ 3 ε values:
    Spearman rank correlation of mean A_m with ε, and the gain from the smallest to the largest ε in
    units of its standard error (sd/√seeds combined). Verdict "rises" needs ρ ≥ 0.7 and gain > 2 SE."""
    verdicts = {}
    for kind in sorted({k.split("@")[0] for k in agg if "@" in k}):
        rows = sorted((float(k.split("@")[1]), v) for k, v in agg.items() if k.startswith(kind + "@"))
        if len(rows) < 3:
            continue
        eps = np.array([e for e, _ in rows])
        mean = np.array([v["A_mean"] for _, v in rows])
        n = len(rows[0][1]["A_runs"])
        se = np.hypot(rows[0][1]["A_sd"], rows[-1][1]["A_sd"]) / np.sqrt(n)
        rho = float(np.corrcoef(np.argsort(np.argsort(eps)), np.argsort(np.argsort(mean)))[0, 1])
        gain = float(mean[-1] - mean[0])
        ok = rho >= 0.7 and gain > 2 * max(se, 1e-9)
        verdicts[kind] = {"spearman": rho, "gain_points": gain, "gain_se": float(se),
                          "verdict": "rises with ε" if ok else "does NOT rise with ε"}
    return verdicts


def sweep_figure(agg: dict, name: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    for kind in sorted({k.split("@")[0] for k in agg if "@" in k}):
        rows = sorted((float(k.split("@")[1]), v) for k, v in agg.items() if k.startswith(kind + "@"))
        ax.errorbar([e for e, _ in rows], [v["A_mean"] for _, v in rows], yerr=[v["A_sd"] for _, v in rows],
                    marker="o", ms=4, capsize=3, label=kind)
    if "agem" in agg:
        ax.axhline(agg["agem"]["A_mean"], color="k", ls="--", lw=1, label="A-GEM (non-private)")
    ax.set_xscale("log")
    ax.set_xlabel("ε")
    ax.set_ylabel("A_m after the last task (%)")
    ax.set_title(f"{name}: accuracy vs ε (mean ± sd over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(agg: dict, name: str) -> str:
    lines = [f"| {name} | A_m (%) mean ± sd | runs | F_m | ε spent | time per run (s) |", "|---|---|---|---|---|---|"]
    for label, v in agg.items():
        runs = ", ".join(f"{a:.1f}" for a in v["A_runs"])
        lines.append(f"| {label} | {v['A_mean']:.2f} ± {v['A_sd']:.2f} | {runs} | {v['F_mean']:.3f} | "
                     f"{v['epsilon_spent']:.3g} | {v['seconds']:.1f} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, type=Path, help="folder holding mnist/ and uci_hapt/")
    ap.add_argument("--datasets", nargs="+", default=["pmnist", "hapt"], choices=["pmnist", "hapt"])
    ap.add_argument("--tasks", type=int, default=10, help="permuted MNIST tasks (paper: 20)")
    ap.add_argument("--train-per-task", type=int, default=1000, help="0 = all 60,000")
    ap.add_argument("--test-per-task", type=int, default=500, help="0 = all 10,000")
    ap.add_argument("--hapt-groups", type=int, default=5)
    ap.add_argument("--eps", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    ap.add_argument("--learners", nargs="+", default=["l2dp", "l2dp-nobn", "naive", "bounded", "agem"],
                    choices=LEARNERS, help="l2dp = L2DP-ML with encoder_batch_norm, l2dp-nobn = without it")
    ap.add_argument("--accountant", default="pld", choices=["pld", "rdp"],
                    help="DP-SGD learners' accountant: pld (tight, default) or rdp (looser)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0],
                    help="one run per seed: task data, permutations and noise key all change with it")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--figures", type=Path, default=Path("docs/figures"))
    ap.add_argument("--sweep-figure", action="store_true", help="write lifelong_<data>_sweep.png (A_m vs ε)")
    ap.add_argument("--curve-figure", action="store_true", help="write lifelong_<data>.png (A_τ per task)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import torch

    torch.set_num_threads(args.threads)
    start = time.time()
    all_results = {}
    for name in args.datasets:
        per_seed = []
        for seed in args.seeds:
            if name == "pmnist":
                data = permuted_mnist(args.data, args.tasks, args.train_per_task, args.test_per_task, seed)
            else:
                data = hapt_tasks(args.data, args.hapt_groups, seed)
            print(f"{name} seed {seed}: {len(data[0])} tasks, train rows per task {[len(t) for t in data[0]]}", flush=True)
            per_seed.append(run_dataset(name, *data, args, seed))
        agg = aggregate(per_seed)
        checks = sanity(agg)
        all_results[name] = {"per_seed": per_seed, "aggregate": agg, "sanity": checks}
        print(markdown(agg, name))
        for kind, c in checks.items():
            print(f"sanity {name} {kind}: {c['verdict']} (Spearman {c['spearman']:.2f}, gain "
                  f"{c['gain_points']:+.2f} points, SE {c['gain_se']:.2f})")
        for eps in args.eps:
            a, b = per_seed[0].get(f"l2dp@{eps:g}"), per_seed[0].get(f"naive@{eps:g}")
            if a and b and len(a["A"]) > 1:
                print(f"p-value L2DP-ML vs NaiveGaussian at ε={eps:g} (two-sample t-test on A_τ curves, seed "
                      f"{args.seeds[0]}): {curve_p_value(a['A'], b['A']):.3g}")
        args.figures.mkdir(parents=True, exist_ok=True)
        if len(args.eps) >= 3 and args.sweep_figure:
            sweep_figure(agg, name, args.figures / f"lifelong_{name}_sweep.png")
        if args.curve_figure:
            figure(per_seed[0], name, args.figures / f"lifelong_{name}.png")
    wall = time.time() - start
    device = "cuda" if (args.device != "cpu" and torch.cuda.is_available()) else "cpu"
    print(f"wall time {wall:.1f} s on {device} (torch {torch.__version__}, threads {args.threads})")
    if args.out is None:
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "wall_seconds": wall,
                                    "device": device, "results": all_results, "paper": PAPER}, indent=1))


if __name__ == "__main__":
    main()
