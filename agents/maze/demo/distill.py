"""Distillation on the maze, measured: from an ``rft demo`` run directory, the GRPO stage again with
an evaluation every few steps, as GRPO alone, distillation alone, or both (docs/distillation.md).

The teacher is the demo's final adapter on its base model (the tiny model, or SmolLM2 with
``--model smollm2``); the student starts from the demo's warm start (``sft-adapter/``) with the
demo's recipe, seed and rollouts per step, so the three modes differ only in the ``distillation``
section::

    python -m agents.maze.demo.distill DEMO_RUN --mode grpo --out OUT [--steps 40] [--eval-steps 5]
    python -m agents.maze.demo.distill --table OUT_GRPO OUT_DISTILL ... [--plot PNG]   # the docs' table
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from agents.maze.demo.agent_process import serve_agent

MODES = {
    "grpo": None,
    "distill": {"weight": 1.0, "reward_weight": 0.0},
    "distill+reward": {"weight": 1.0, "reward_weight": 1.0},
}
RESULTS = "distill-results.json"


def run_mode(
    demo_run: Path,
    mode: str,
    out: Path,
    steps: int,
    eval_steps: int,
    start_eval: bool = True,
    resume: bool = False,
) -> dict[str, Any]:
    """The demo's GRPO stage in ``mode`` from its warm start; each evaluation's success and wall time
    since the run began (evaluations included). ``start_eval``: evaluate the warm start first (the
    same for every mode, so one run is enough). ``resume``: continue ``out`` from its newest
    checkpoint up to ``steps`` (the learning-rate schedule is constant after its warm-up, so a run
    extended this way repeats a longer run's steps)."""
    import time

    from trainer import train
    from trainer.config import load_config

    with serve_agent() as agent_url:
        config = load_config(demo_run / "train.yaml")
        fields: dict[str, Any] = {
            "agents": [agent_url],
            "output_dir": out,
            "max_steps": steps,
            "eval_steps": eval_steps,
            "mlflow_tracking_uri": "none",
            "eval_on_start": start_eval,
        }
        distillation = MODES[mode]
        if distillation is not None:
            # The demo's base model (its tiny model's directory, or SmolLM2's) with its final adapter.
            teacher = {"teacher": Path(str(config.model)), "teacher_adapter": demo_run / "adapter"}
            fields["distillation"] = {**teacher, **distillation}
        config = config.model_validate({**config.model_dump(), **fields})
        started = time.time()
        summary = train(config, resume=resume)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    elapsed = {record["step"]: record["time"] - started for record in records}
    evaluations = [
        {"step": e["step"], "success_rate": e["success_rate"], "wall_s": elapsed.get(e["step"], 0.0)}
        for e in summary.evaluations
    ]
    result = {"mode": mode, "steps": steps, "eval_steps": eval_steps, "evaluations": evaluations}
    (out / RESULTS).write_text(json.dumps(result, indent=1))
    return result


def evaluations(run: Path) -> dict[str, Any]:
    """A run's mode and its evaluations after step 0, read from its metrics.jsonl (so a run stopped
    early still shows the ones it made): success and the run's wall time to that step, evaluations
    included, the warm start's own evaluation not."""
    settings = json.loads((run / "config.json").read_text()).get("distillation")
    mode = "grpo" if settings is None else "distill" if settings["reward_weight"] == 0 else "distill+reward"
    points, elapsed = [], 0.0
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        elapsed += record["time_s"]["step"]
        if "eval" in record:
            points.append(
                {"step": record["step"], "success_rate": record["eval"]["success_rate"], "wall_s": elapsed}
            )
    return {"mode": mode, "evaluations": points}


def table(runs: list[Path], teacher: float, start: float, plot: Path | None) -> str:
    """Success after each evaluation per run (step 0: the warm start's ``start``), and the first
    evaluation within 3 points of ``teacher``."""
    results = [evaluations(run) for run in runs]
    steps = sorted({e["step"] for result in results for e in result["evaluations"]})
    lines = ["| step | " + " | ".join(r["mode"] for r in results) + " |", "|---" * (len(results) + 1) + "|"]
    lines.append("| 0 (warm start) | " + " | ".join(f"{start:.1%}" for _ in results) + " |")
    for step in steps:
        cells = []
        for result in results:
            found = [e for e in result["evaluations"] if e["step"] == step]
            cells.append(f"{found[0]['success_rate']:.1%} ({found[0]['wall_s']:.0f} s)" if found else "")
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    reached = []
    for result in results:
        first = next((e for e in result["evaluations"] if e["success_rate"] >= teacher - 0.03), None)
        reached.append(f"step {first['step']}, {first['wall_s']:.0f} s" if first else "not reached")
    lines.append(f"| within 3 points of the teacher ({teacher:.1%}) | " + " | ".join(reached) + " |")
    if plot is not None:
        _plot(results, teacher, start, plot)
    return "\n".join(lines) + "\n"


def _plot(results: list[dict[str, Any]], teacher: float, start: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 3.5))
    for result in results:
        points = [{"step": 0, "success_rate": start}, *result["evaluations"]]
        steps, success = [e["step"] for e in points], [e["success_rate"] for e in points]
        axes.plot(steps, success, marker="o", label=result["mode"])
    axes.axhline(teacher, color="gray", linestyle="--", label="teacher")
    axes.set_ylim(top=max(axes.get_ylim()[1], teacher + 0.03))  # the teacher's line in view
    axes.set_xlabel("step")
    axes.set_ylabel("success on the 64 mazes")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("demo_run", nargs="?", type=Path, help="an `rft demo` run directory (--out)")
    parser.add_argument("--mode", choices=sorted(MODES), default="grpo")
    parser.add_argument("--out", type=Path, help="this run's directory")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eval-steps", type=int, default=5)
    parser.add_argument("--no-start-eval", action="store_true", help="skip the warm start's evaluation")
    parser.add_argument(
        "--resume", action="store_true", help="continue --out from its last checkpoint to --steps"
    )
    parser.add_argument("--table", nargs="+", type=Path, help="print the table of these runs' results")
    parser.add_argument("--teacher", type=float, default=0.758, help="the teacher's success (for --table)")
    parser.add_argument("--start", type=float, default=0.359, help="the warm start's success (for --table)")
    parser.add_argument("--plot", type=Path, help="with --table: a PNG of success over steps")
    args = parser.parse_args(argv)
    if args.table:
        print(table(args.table, args.teacher, args.start, args.plot))
        return 0
    if args.demo_run is None or args.out is None:
        parser.error("give DEMO_RUN and --out (or --table RUN ...)")
    from trainer.ops import pin_cpu_kernels

    pin_cpu_kernels()  # as `rft demo` and `rft train` do, before the first tensor operation
    start_eval = not args.no_start_eval
    result = run_mode(
        args.demo_run, args.mode, args.out, args.steps, args.eval_steps, start_eval, args.resume
    )
    print(json.dumps(result["evaluations"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
