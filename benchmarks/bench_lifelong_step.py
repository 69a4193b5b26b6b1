"""The bounded DP-SGD + A-GEM learner against a plain ``torch.func`` DP-SGD loop on the same work (issue 27.2).

Both train the same dense network (d = 784, β = 64, G = 64 ReLU → 32 clipped, 10 classes) with SGD on
the same synthetic tasks (``--tasks`` × ``--rows`` rows in [−1, 1], random labels: speed only), Poisson
batches of expected size λ = ``--batch``, per-example clipping and Gaussian noise, one epoch per task,
``--threads`` torch threads, ``--dtype``. The plain loop is the floor: vmap(grad) per-example gradients,
clip, ``torch.randn`` noise, an SGD update, nothing else (no keyed noise, no accountant, no memory). The
learner adds what makes it a private lifelong learner: keyed noise cells, the accountant, and A-GEM's
reference gradient on a memory batch of λ rows at every step from task 2 on (up to 2× the gradient
work). Reported: µs per task example (steps × λ), best of ``--repeat``; the accountant's one-time
calibration is excluded by a warm-up run with the same public shapes.

    OMP_NUM_THREADS=1 python benchmarks/bench_lifelong_step.py --out docs/performance.md
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np
import torch

from beam_dp.core import NoiseSource
from beam_dp.mechanisms.lifelong import BoundedAGEMConfig, TaskData
from beam_dp.mechanisms.lifelong.factory import build_learner
from beam_dp.mechanisms.lifelong.network import classifier, encode, init_params
from benchmarks.report import emit_report


def _tasks(n_tasks: int, rows: int, dim: int) -> list[TaskData]:
    rng = np.random.default_rng(0)
    return [TaskData(str(t), rng.uniform(-1, 1, (rows, dim)), rng.integers(0, 10, rows)) for t in range(n_tasks)]


def _loss(p, x, y):
    _, z = classifier(p, encode(p, x.unsqueeze(0)), 2, batch_stats=False)
    return torch.nn.functional.cross_entropy(z, y.unsqueeze(0), reduction="sum")


def plain_loop(tasks, args, dtype) -> int:
    """The floor: plain torch.func DP-SGD over the tasks; returns the number of steps."""
    params = {k: torch.as_tensor(v, dtype=dtype) for k, v in
              init_params(np.random.default_rng(1), 784, args.hidden, (64, 32), 10).items()}
    grads = torch.func.vmap(torch.func.grad(_loss), in_dims=(None, 0, 0))
    gen = torch.Generator().manual_seed(0)
    steps = 0
    for task in tasks:
        x, y = torch.as_tensor(task.x, dtype=dtype), torch.as_tensor(task.y)
        q = args.batch / len(task)
        for _ in range(round(len(task) / args.batch)):
            rows = torch.nonzero(torch.rand(len(task), generator=gen) < q).reshape(-1)
            per = grads(params, x[rows], y[rows])
            flat = [per[k].reshape(rows.shape[0], -1) for k in params]
            f = torch.clamp(args.clip / torch.sqrt(sum((g * g).sum(1) for g in flat)), max=1.0)
            with torch.no_grad():
                for k, g in zip(params, flat):
                    noisy = f @ g + torch.randn(g.shape[1], generator=gen, dtype=dtype) * args.z * args.clip
                    params[k] -= args.lr * (noisy / args.batch).reshape(params[k].shape)
            steps += 1
    return steps


def learner_run(tasks, args) -> int:
    config = BoundedAGEMConfig(input_dim=784, n_classes=10, hidden=args.hidden, g_layers=(64, 32),
                               batch_size=args.batch, learning_rate=args.lr, optimizer="sgd", epochs=1,
                               task_ids=tuple(t.task_id for t in tasks), device="cpu", dtype=args.dtype,
                               epsilon=1.0, delta=1e-5, clip_norm=args.clip, memory_uses=10 ** 6,
                               task_size=args.rows)
    learner = build_learner(config)
    state, steps = learner.init_state("bench"), 0
    noise = NoiseSource(b"bench-key-0123456789abcdef")
    for task in tasks:
        state, (release,) = learner.step(state, task, noise)
        steps += release.meta["steps"]
    return steps


def best_of(fn, repeat: int) -> tuple[float, int]:
    best, steps = float("inf"), 0
    for _ in range(repeat):
        t0 = time.process_time()
        steps = fn()
        best = min(best, time.process_time() - t0)
    return best, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--clip", type=float, default=0.1)
    parser.add_argument("--z", type=float, default=1.0, help="plain loop's noise multiplier (speed only)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", help="append the report to this Markdown file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch.float32 if args.dtype == "float32" else torch.float64
    tasks = _tasks(args.tasks, args.rows, 784)
    learner_run(tasks[:1], args)  # warm-up: imports, torch.func tracing caches, the accountant's calibration
    plain_s, plain_steps = best_of(functools.partial(plain_loop, tasks, args, dtype), args.repeat)
    learner_s, learner_steps = best_of(functools.partial(learner_run, tasks, args), args.repeat)
    per = {name: 1e6 * s / (steps * args.batch) for name, s, steps in
           (("plain", plain_s, plain_steps), ("learner", learner_s, learner_steps))}
    lines = [f"### Bounded DP-SGD + A-GEM vs a plain torch.func DP-SGD loop ({args.tasks} tasks × {args.rows} rows, "
             f"λ = {args.batch}, {args.dtype}, {args.threads} thread(s), CPU seconds best of {args.repeat})", "",
             "| path | steps | CPU (s) | µs per example | × plain |", "|---|---|---|---|---|",
             f"| plain torch.func DP-SGD loop | {plain_steps} | {plain_s:.2f} | {per['plain']:.0f} | 1.00 |",
             f"| BoundedDPAGEM (keyed noise, accountant, A-GEM reference gradient from task 2) | {learner_steps} | "
             f"{learner_s:.2f} | {per['learner']:.0f} | {per['learner'] / per['plain']:.2f} |"]
    emit_report(lines, args.out)


if __name__ == "__main__":
    main()
