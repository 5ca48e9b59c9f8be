"""Two pytest workers on two cores: torch's threads per worker, side by side.

`make test` runs two workers; each one's torch once spread its OpenMP threads over every core, so
two workers ran four busy threads on two cores. This times the visual quick plan's warm-start steps
(the suite's longest compute) in one process and in two processes at once, each at 1 and at 2 torch
threads, and checks that every run ends on the same loss (the thread count changes no result).
Medians of the per-step times; ratios against one process on all the cores. Writes
``bench/results/worker_threads.json``.

    .venv/bin/python bench/worker_threads.py [--steps 30]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "worker_threads.json"


def child(steps: int, threads: int, out: Path) -> None:
    """One warm start of ``steps`` steps at ``threads`` torch threads; prints its step times and loss."""
    import torch

    from agents.maze.demo.model import build_demo_model
    from agents.maze.demo.plans import VISION_QUICK as plan
    from agents.maze.demonstrations import maze_demonstrations
    from trainer.ops.cpu_kernels import pin_cpu_kernels
    from trainer.sft import run_sft

    pin_cpu_kernels()
    torch.set_num_threads(threads)
    model_dir, targets = build_demo_model(plan, out / "model", 0)
    demos = maze_demonstrations(
        plan.sft_demos,
        0,
        noise=plan.sft_noise,
        seed=0,
        labels=plan.sft_labels,  # type: ignore[arg-type]
        observation=plan.observation,  # type: ignore[arg-type]
    )
    stamps: list[float] = []
    result = run_sft(
        model_dir,
        demos,
        out / "adapter",
        steps=steps,
        learning_rate=plan.sft_learning_rate,
        batch_size=plan.sft_batch_size,
        lora_r=plan.lora_r,
        lora_alpha=plan.lora_alpha,
        target_modules=targets,
        seed=0,
        on_step=lambda step, loss: stamps.append(time.perf_counter()),
    )
    steps_s = [later - earlier for earlier, later in itertools.pairwise(stamps)]
    print(json.dumps({"step_s": steps_s, "loss": result.losses[-1]}))


def run(copies: int, threads: int, steps: int) -> dict[str, object]:
    """``copies`` processes at once, each at ``threads`` threads: their median step time and losses."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    with tempfile.TemporaryDirectory() as tmp:
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    "--steps",
                    str(steps),
                    "--threads",
                    str(threads),
                    "--out",
                    str(Path(tmp) / str(index)),
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            for index in range(copies)
        ]
        outputs = [json.loads(proc.communicate()[0].strip().splitlines()[-1]) for proc in procs]
    return {
        "copies": copies,
        "threads": threads,
        "median_step_s": statistics.median(s for out in outputs for s in out["step_s"]),
        "losses": [out["loss"] for out in outputs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.steps, args.threads, args.out)
        return
    cores = len(os.sched_getaffinity(0))
    rows = [run(copies, threads, args.steps) for copies in (1, 2) for threads in (cores, 1)]
    alone = rows[0]["median_step_s"]
    for row in rows:
        row["vs_one_process_on_all_cores"] = round(row["median_step_s"] / alone, 2)  # type: ignore[operator]
        print(
            f"{row['copies']} process(es) x {row['threads']} thread(s): {row['median_step_s']:.3f} s a step "
            f"({row['vs_one_process_on_all_cores']}x), final losses {row['losses']}"
        )
    losses = {loss for row in rows for loss in row["losses"]}  # type: ignore[attr-defined]
    print("the same loss in every run" if len(losses) == 1 else f"losses differ: {sorted(losses)}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"cores": cores, "steps": args.steps, "runs": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
