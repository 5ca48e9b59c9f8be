"""``rft train CONFIG [--resume] [--set key=value ...]``: GRPO on a LoRA adapter."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.config import ConfigError, load_config
from trainer.ops import pin_cpu_kernels

if TYPE_CHECKING:
    from trainer.run import RunSummary

# What a run that never updated its adapter can try next (a sparse reward gives a group equal rewards).
NO_UPDATE_ADVICE = (
    "A policy that never earns a reward learns nothing from GRPO: warm-start an adapter on "
    "demonstrations with `rft sft --data FILE` (its format: docs/sft.md) and set init_adapter to it; "
    "collect them from a run's good episodes (of a stronger model, or a scripted policy) with "
    "`rft show RUN --export-demos FILE --min-reward X`"
)

# Flags for the fields people change most; any other field goes through --set.
_COMMON_FLAGS: list[tuple[str, str, type, str]] = [
    ("--max-steps", "max_steps", int, "training steps"),
    ("--output-dir", "output_dir", str, "run directory"),
    ("--engine", "engine", str, "inference engine: hf or vllm"),
    ("--model", "model", str, "base model directory"),
    ("--agent", "agents", str, "agent target (URL or AgentCore runtime ARN); repeat for several"),
    ("--num-generations", "num_generations", int, "rollouts per row (G)"),
    ("--rows-per-step", "rows_per_step", int, "dataset rows per step"),
    ("--learning-rate", "learning_rate", float, "peak learning rate"),
    ("--seed", "seed", int, "seed of data order, sampling and initialisation"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rft train",
        description="Train a LoRA adapter with GRPO on rollouts played by your agents.",
    )
    parser.add_argument("config", help="YAML or TOML training config (see docs/config.md)")
    parser.add_argument(
        "--resume", action="store_true", help="continue from the newest checkpoint in output_dir"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config field, dotted for sections (e.g. --set lora.r=8); repeatable",
    )
    for flag, field, kind, help_text in _COMMON_FLAGS:
        if field == "agents":
            parser.add_argument(flag, dest=field, action="append", help=help_text)
        elif field == "engine":
            parser.add_argument(flag, dest=field, choices=["hf", "vllm"], help=help_text)
        else:
            parser.add_argument(flag, dest=field, type=kind, help=help_text)
    parser.add_argument("-v", "--verbose", action="store_true", help="log every step to stderr")
    return parser


def _overrides(args: argparse.Namespace) -> list[str]:
    overrides = list(args.overrides)
    for _, field, _, _ in _COMMON_FLAGS:
        value = getattr(args, field)
        if value is None:
            continue
        if field == "agents":
            overrides.append(f"agents=[{', '.join(value)}]")
        elif field in ("output_dir", "model") and (field == "output_dir" or Path(value).exists()):
            # Paths on the command line are relative to where the command runs, not to the config.
            overrides.append(f"{field}={Path(value).resolve()}")
        else:
            overrides.append(f"{field}={value}")
    return overrides


def main(argv: list[str] | None = None) -> int:
    argv_list = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv_list)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(args.config, _overrides(args))
    except ConfigError as error:
        print(f"rft train: {error}", file=sys.stderr)
        return 2
    if config.placement.cpu_kernels == "avx2":
        pin_cpu_kernels()  # before the run's first tensor operation
    from trainer.errors import TrainingError
    from trainer.loop import train
    from trainer.ops.preemption import RunPreempted, interrupted_message, resume_command
    from trainer.scale.placement import PlacementError
    from trainer.scale.plan import PlanError

    try:
        summary = train(config, resume=args.resume)
    except (TrainingError, PlanError, PlacementError) as error:
        print(f"rft train: {error}", file=sys.stderr)
        return 1
    except RunPreempted as stopped:
        print(f"rft train: {stopped}; resume with `{resume_command(argv_list)}`", file=sys.stderr)
        return 0
    except KeyboardInterrupt:
        print(interrupted_message(argv_list, config.output_dir / "checkpoints"), file=sys.stderr)
        return 130
    outcome, code = run_outcome(summary)
    steps = "1 step" if summary.steps == 1 else f"{summary.steps} steps"
    print(f"rft train: {steps} done in {summary.run_dir}; {outcome}", file=sys.stderr if code else sys.stdout)
    return code


def run_outcome(summary: RunSummary) -> tuple[str, int]:
    """What the run's closing line says it produced, and the exit status. A run no step of which
    updated the adapter while rollouts failed exits 1 naming the failures (the likeliest reason no
    group had two scored rollouts to compare); one whose scored groups all lacked reward variance
    points to a warm start, or says the warm start it was given is the final adapter, unchanged."""
    updated = sum(bool(record.get("update", {}).get("applied")) for record in summary.history)
    failed = failures_over(summary.history)
    if not updated and failed:
        return (
            f"no step updated the adapter, and rollouts failed: {failed}. Fix what failed (the agents' "
            "own logs have the details) and train again",
            1,
        )
    if summary.adapter_dir is None:
        reason = "no update was applied (every group lacked reward variance or valid rollouts)"
        return f"{reason}. {NO_UPDATE_ADVICE}", 0
    if not updated:
        return (
            f"no step updated the adapter (every group lacked reward variance or valid rollouts): the "
            f"final adapter v{summary.adapter_version} at {summary.adapter_dir} is the init_adapter "
            "unchanged",
            0,
        )
    return f"final adapter v{summary.adapter_version} at {summary.adapter_dir}", 0


def failures_over(history: list[dict[str, Any]]) -> str:
    """The run's failed rollouts by cause, each with its first error text (and row); "" for none."""
    counts: dict[str, int] = {}
    first: dict[str, str] = {}
    for record in history:
        for cause, count in record.get("failures", {}).items():
            counts[cause] = counts.get(cause, 0) + int(count)
        for cause, text in record.get("failure_errors", {}).items():
            first.setdefault(cause, text)
    total = sum(record.get("rollouts", {}).get("total", 0) for record in history)
    return "; ".join(
        f"{cause} x{count} of {total} rollouts, first: {first.get(cause, '(no error text)')}"
        for cause, count in counts.items()
        if count
    )
