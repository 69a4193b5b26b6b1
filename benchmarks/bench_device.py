"""Device benchmark (issue 27.6): examples (or releases) per second on CPU and CUDA for the torch paths,
with CPU–CUDA agreement checks, written to docs/performance.md.

Rows (each on every device of ``--devices`` that is present; CUDA rows are skipped without a GPU):

* lifelong, small run: bounded DP-SGD + A-GEM and L2DP-ML, ``--small-tasks`` × ``--small-n`` examples;
* lifelong, the paper's setting: 20 tasks × 60,000, ε = 0.5, 1 epoch, bounded learner, on every device
  (not with ``--quick``); it stops after the task that passes ``--paper-budget`` seconds and reports the
  tasks done, so CPU and CUDA rates compare on the same work per example (the whole run takes ~12 min
  on 2 CPU cores: raise the budget to see it);
* ERM: the certified solver (torch, float64) on ``n × f`` softmax data: example-gradients per second;
* incremental regression at large d: PRIVINCREG₁ (numpy reference, torch) at ``--reg-dim``: steps per second.

Agreement: the ERM points (within ``device_tolerance`` of float64 and the iteration count, or ``target/λ``
when the devices stop an iteration apart) and the regression releases (1e-8 absolute: the float64
reassociation bound of ``tests/mechanisms/online/test_regression_torch.py`` at these sizes) of CUDA against CPU.
Lifelong data are synthetic (MNIST-shaped: 784 features in [−1, 1], 10 classes): the speed does not depend
on the pixels. Lifelong learners come from their public configs (``benchmarks/reproduce_lifelong.py``).

    .venv/bin/python benchmarks/bench_device.py                  # GPU machine: < 5 min, all rows
    .venv/bin/python benchmarks/bench_device.py --quick --out /tmp/bench.md   # CPU rows, small, ~20 s

The table replaces the section between ``<!-- bench_device:start -->`` and ``<!-- bench_device:end -->``
of ``--out`` (default docs/performance.md; appended when the markers are absent).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's beam_dp
sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import machine_comment  # noqa: E402

from beam_dp.core import NoiseSource  # noqa: E402
from beam_dp.mechanisms.erm import SoftmaxRegression  # noqa: E402
from beam_dp.mechanisms.erm.solver import certified_solve  # noqa: E402
from beam_dp.mechanisms.erm.solver_torch import device_tolerance  # noqa: E402
from beam_dp.mechanisms.lifelong import BoundedAGEMConfig, L2DPConfig, TaskData  # noqa: E402
from beam_dp.mechanisms.lifelong.factory import build_learner  # noqa: E402
from beam_dp.mechanisms.online.regression import PrivIncReg1  # noqa: E402

KEY = bytes(range(32))  # public benchmark key
START, END = "<!-- bench_device:start -->", "<!-- bench_device:end -->"
REG_TOL = 1e-8


def task(i: int, n: int) -> TaskData:
    rng = np.random.default_rng(i)
    return TaskData(str(i), rng.uniform(-1, 1, size=(n, 784)).astype(np.float32), rng.integers(0, 10, n))


def lifelong(kind: str, n_tasks: int, n: int, epsilon: float, device: str, budget: float | None = None) -> dict:
    """Train ``n_tasks`` synthetic tasks of ``n`` examples; stop after the task that passes ``budget`` s."""
    common = dict(input_dim=784, n_classes=10, hidden=64, g_layers=(64, 32), batch_size=32, epochs=1,
                  task_ids=tuple(str(i) for i in range(n_tasks)), device=device, dtype="float32")
    if kind == "bounded":
        config = BoundedAGEMConfig(**common, epsilon=epsilon, delta=1e-5, clip_norm=0.1, memory_uses=100, memory_share=0.3,
                                   task_size=n)  # the benchmark chose n: public
    else:
        config = L2DPConfig(**common, epsilon=epsilon)
    learner = build_learner(config)
    state, noise, done, seconds = learner.init_state("bench"), NoiseSource(KEY), 0, 0.0
    for i in range(n_tasks):
        data = task(i, n)
        t0 = time.perf_counter()
        state, _ = learner.step(state, data, noise)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds += time.perf_counter() - t0
        done += 1
        if budget is not None and seconds > budget:
            break
    return {"rate": done * n / seconds, "seconds": seconds, "done": f"{done}/{n_tasks} tasks × {n}"}


def erm(n: int, f: int, device: str) -> dict:
    model = SoftmaxRegression(n_features=f, clip_bound=1.0, n_classes=10)
    rng = np.random.default_rng(0)
    X = model.augment(rng.normal(size=(n, f)) / np.sqrt(f))
    y = rng.integers(0, 10, n)
    lam, target = 1e-3, 1e-3 * model.lipschitz / n
    t0 = time.perf_counter()
    res = certified_solve(model, X, y, n, lam, np.zeros(model.dim), "torch", tolerance=1e-3, device=device)
    seconds = time.perf_counter() - t0
    return {"rate": n * max(res.iterations, 1) / seconds, "seconds": seconds, "done": f"n={n}, f={f}, {res.iterations} it",
            "w": res.w, "it": res.iterations, "tol_same": device_tolerance(res.iterations, *X.shape), "tol_any": target / lam}


def regression(d: int, T: int, backend: str, device: str) -> dict:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(T, d))
    y = np.clip(X[:, 0] / np.linalg.norm(X, axis=1), -1, 1)
    mech = PrivIncReg1(dim=d, epsilon=1.0, delta=1e-6, horizon=T, release_every=max(T // 4, 1), backend=backend,
                       device=device)
    t0 = time.perf_counter()
    rels = mech.run("s", list(zip(X, y)), NoiseSource(KEY))
    seconds = time.perf_counter() - t0
    return {"rate": T / seconds, "seconds": seconds, "done": f"d={d}, T={T}", "theta": np.array([r.value["theta"] for r in rels])}


def agreement(rows: dict, name: str, check) -> str:
    cpu, gpu = rows.get((name, "cpu")), rows.get((name, "cuda"))
    return "" if cpu is None or gpu is None else check(cpu, gpu)


def erm_check(cpu: dict, gpu: dict) -> str:
    diff = float(np.abs(cpu["w"] - gpu["w"]).max())
    tol = cpu["tol_same"] * max(1.0, float(np.abs(cpu["w"]).max())) if cpu["it"] == gpu["it"] else cpu["tol_any"]
    return f"max diff {diff:.2g} {'<=' if diff <= tol else 'EXCEEDS'} {tol:.2g}"


def reg_check(cpu: dict, gpu: dict) -> str:
    diff = float(np.abs(cpu["theta"] - gpu["theta"]).max())
    return f"max diff {diff:.2g} {'<=' if diff <= REG_TOL else 'EXCEEDS'} {REG_TOL:g}"


def run(args) -> list[str]:
    devices = [d for d in args.devices if d == "cpu" or torch.cuda.is_available()]
    rows: dict = {}
    s_tasks, s_n = (1, 64) if args.quick else (args.small_tasks, args.small_n)
    for dev in devices:
        for kind in ("bounded", "l2dp"):
            rows[(f"lifelong {kind}, small (ε = 1)", dev)] = lifelong(kind, s_tasks, s_n, 1.0, dev)
        if not args.quick and not args.no_paper:
            rows[("lifelong bounded, paper (20 × 60,000, ε = 0.5)", dev)] = lifelong(
                "bounded", 20, 60_000, 0.5, dev, budget=args.paper_budget)
        n, f = (500, 10) if args.quick else (args.erm_n, args.erm_f)
        rows[("ERM certified solver (torch float64)", dev)] = erm(n, f, dev)
        d, T = (32, 8) if args.quick else (args.reg_dim, args.reg_steps)
        rows[("PRIVINCREG1 torch", dev)] = regression(d, T, "torch", dev)
    d, T = (32, 8) if args.quick else (args.reg_dim, args.reg_steps)
    rows[("PRIVINCREG1 numpy (reference)", "cpu")] = regression(d, T, "numpy", "cpu")
    checks = {"ERM certified solver (torch float64)": erm_check, "PRIVINCREG1 torch": reg_check}
    gpu = torch.cuda.get_device_name(0) if "cuda" in devices else "none"
    lines = [START, "", "Machine: " + machine_comment().lstrip("# ") + f"; torch {torch.__version__}; GPU: {gpu}; "
             f"torch threads {torch.get_num_threads()}", "",
             f"Command: `python {' '.join(sys.argv)}`", "",
             "| workload | device | size | seconds | per second | CPU–CUDA agreement |", "|---|---|---|---|---|---|"]
    for (name, dev), r in rows.items():
        unit = "steps" if name.startswith("PRIVINCREG") else ("example-gradients" if name.startswith("ERM") else "examples")
        check = agreement(rows, name, checks[name]) if name in checks and dev == "cuda" else ""
        rate = f"{r['rate']:,.0f}" if r["rate"] >= 100 else f"{r['rate']:.3g}"
        seconds = f"{r['seconds']:.2f}" if r["seconds"] >= 0.1 else f"{r['seconds']:.2g}"  # a quick row: ms
        lines.append(f"| {name} | {dev} | {r['done']} | {seconds} | {rate} {unit} | {check} |")
    if "cuda" not in devices:
        lines += ["", "No CUDA device here: CPU rows only (CUDA rows and agreement checks need a GPU machine)."]
    lines += ["", END]
    return lines


def write_section(path: Path, lines: list[str]) -> None:
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    block = "\n".join(lines)
    if START in text and END in text:
        head, rest = text.split(START, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text + ("\n" if text and not text.endswith("\n") else "") + "\n" + block + "\n"
    path.write_text(text, encoding="utf-8")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, no paper-setting row (CI smoke test)")
    ap.add_argument("--devices", nargs="+", default=["cpu", "cuda"], choices=["cpu", "cuda"])
    ap.add_argument("--no-paper", action="store_true", help="skip the paper's lifelong setting")
    ap.add_argument("--paper-budget", type=float, default=45.0,
                    help="seconds (per device) after which the paper-setting row stops at the end of a task")
    ap.add_argument("--small-tasks", type=int, default=10)
    ap.add_argument("--small-n", type=int, default=1_000)
    ap.add_argument("--erm-n", type=int, default=50_000)
    ap.add_argument("--erm-f", type=int, default=100)
    ap.add_argument("--reg-dim", type=int, default=1_000)
    ap.add_argument("--reg-steps", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--out", type=Path, default=None,
                    help="markdown file whose bench_device section is rewritten (default docs/performance.md; "
                         "none with --quick, a smoke test whose numbers are not a benchmark)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    lines = run(args)
    print("\n".join(lines))
    out = args.out or (None if args.quick else Path("docs/performance.md"))
    if out is not None:
        write_section(out, lines)
    print(f"wall {time.time() - t0:.0f} s; table " + (f"written to {out}" if out else "not written (--quick)")
          + f" (pid {os.getpid()})")


if __name__ == "__main__":
    main()
