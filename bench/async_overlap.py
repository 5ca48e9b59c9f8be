"""Synchronous vs asynchronous training on one agent whose episodes take a long-tailed time.

The agent is ``agents/letters/sleepy.py``: the letters agent (two real model calls per
episode through the policy server) after a seeded log-normal sleep, ``--sleep-s`` median, so a step's
rollouts end when its slowest episode does. The same short ``rft train`` run (tiny model, hf engine,
LoRA learner, all in this process, on this machine's cores) is played with ``max_off_policy_steps``
0 (synchronous) and 1 (asynchronous), alternating over ``--rounds``, after one unmeasured warm-up
run. From every step after the first (the first has nothing to overlap with) it reads the run's own
``time_s`` record: the step's wall time, its rollouts' wall time (submission to the last episode's
end) and its update time (optimizer passes plus publishing the adapter). Reported, medians over
all those steps:

- the speed-up: synchronous step time / asynchronous step time;
- the overlap ratio: asynchronous step time / max(rollout time, update time), with the rollout and
  update times of the synchronous runs (each measured alone, so contention between sampling and
  learning counts against the asynchronous side). 1.0 would be perfect overlap; the goal is <= 1.15.

    .venv/bin/python bench/async_overlap.py [--rounds 2] [--steps 6] [--sleep-s 0.5] [--iterations 6]

``--iterations`` (num_iterations) makes the update last about as long as the rollouts, where overlap
matters most. Writes bench/results/async_overlap.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agents.letters.run_files import QUESTIONS, serving, write_run_files  # noqa: E402
from agents.letters.sleepy import app  # noqa: E402
from policy_server.models.tiny import build_tiny_model  # noqa: E402
from trainer.config import load_config  # noqa: E402
from trainer.loop import train  # noqa: E402

RESULTS = REPO / "bench" / "results" / "async_overlap.json"
MODES = {"sync": 0, "async": 1}


def run_once(work: Path, model_dir: Path, agent_url: str, args: argparse.Namespace, k: int) -> list[dict]:
    """One training run; the time_s record of every step after the first."""
    config_path = write_run_files(
        work,
        model_dir,
        agent_url,
        eval_file=None,
        max_steps=args.steps,
        num_iterations=args.iterations,
        max_off_policy_steps=k,
        save_steps=args.steps,
        rollout_timeout_s=600,
    )
    rows = "".join(json.dumps({"question": q, "sleep_s": args.sleep_s}) + "\n" for q in QUESTIONS[:4])
    (work / "train.jsonl").write_text(rows)
    summary = train(load_config(config_path, [f"output_dir={work / 'run'}"]))
    return [
        {
            "step": record["time_s"]["step"],
            "rollout": record["time_s"]["rollout"],
            "update": record["time_s"]["update"] + record["time_s"]["adapter_load"],
            "staleness_max": record["staleness"]["max"],
        }
        for record in summary.history[1:]
    ]


def median(steps: list[dict], key: str) -> float:
    return statistics.median(step[key] for step in steps)


def report(steps: dict[str, list[dict]]) -> dict[str, Any]:
    sync, asynchronous = steps["sync"], steps["async"]
    bound = max(median(sync, "rollout"), median(sync, "update"))
    return {
        "median_s": {
            mode: {key: median(rows, key) for key in ("step", "rollout", "update")}
            for mode, rows in steps.items()
        },
        "speedup": median(sync, "step") / median(asynchronous, "step"),
        "async_step_over_max_rollout_update": median(asynchronous, "step") / bound,
        "sync_step_over_max_rollout_update": median(sync, "step") / bound,
        "async_staleness_max": max(step["staleness_max"] for step in asynchronous),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--sleep-s", type=float, default=0.5, help="median episode sleep (seconds)")
    parser.add_argument("--iterations", type=int, default=6, help="num_iterations (update length)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    steps: dict[str, list[dict]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp, serving(app) as agent_url:
        model_dir = build_tiny_model(Path(tmp) / "model", seed=0)
        # Torch's first passes over each new shape are slow in a fresh process: warm up, unmeasured.
        run_once(Path(tmp) / "warm-up", model_dir, agent_url, args, 1)
        for round_index in range(args.rounds):
            for mode, k in MODES.items():
                work = Path(tmp) / f"{mode}-{round_index}"
                steps[mode] += run_once(work, model_dir, agent_url, args, k)
    result = {
        "command": "bench/async_overlap.py " + " ".join(sys.argv[1:]),
        "settings": vars(args) | {"output": args.output.name},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        **report(steps),
        "steps": steps,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    medians = result["median_s"]
    print("| mode | step s | rollout s | update s |")
    print("|---|---|---|---|")
    for mode in MODES:
        row = medians[mode]
        print(f"| {mode} | {row['step']:.2f} | {row['rollout']:.2f} | {row['update']:.2f} |")
    overlap = result["async_step_over_max_rollout_update"]
    sync_overlap = result["sync_step_over_max_rollout_update"]
    print(
        f"speed-up {result['speedup']:.2f}x; step / max(rollout, update): async {overlap:.2f}, "
        f"sync {sync_overlap:.2f}"
    )


if __name__ == "__main__":
    main()
