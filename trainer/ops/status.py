"""``rft status RUN_DIR``: a table of a run in progress or finished, read from its directory.

Reads only files (``metrics.jsonl``, ``checkpoints/``, ``eval_table.json``), never torch, so it works
on any machine that can see the run directory, while the run writes it.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trainer.ops.run_figures import agent_metrics_lines, fidelity_lines

METRICS_FILE = "metrics.jsonl"
LOG_FILE = "train.log"
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_PREFIX = "step-"
STALL_FILE = "stall.txt"  # the stall watchdog's diagnosis while the run is stalled (trainer.ops.watchdog)


@dataclass(frozen=True)
class RunStatus:
    """What a run directory says about its run."""

    run_dir: Path
    records: list[dict[str, Any]]
    last_checkpoint: Path | None
    eval_table: dict[str, Any] | None


def read_records(path: Path) -> list[dict[str, Any]]:
    """The step records of ``metrics.jsonl``; a line being written (not yet whole JSON) is left out."""
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "step" in record:
            records.append(record)
    return records


def last_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (its state.json is written before the rename), or None."""
    directory = run_dir / CHECKPOINTS_DIR
    if not directory.is_dir():
        return None
    found = [
        path
        for path in directory.iterdir()
        if path.name.startswith(CHECKPOINT_PREFIX)
        and path.name[len(CHECKPOINT_PREFIX) :].isdigit()
        and (path / "state.json").is_file()
    ]
    return max(found, key=lambda path: int(path.name[len(CHECKPOINT_PREFIX) :]), default=None)


def read_status(run_dir: Path) -> RunStatus:
    metrics = run_dir / METRICS_FILE
    if not metrics.is_file() and (run_dir / LOG_FILE).is_file():
        # A run writes its log at once and its first record after the first step.
        return RunStatus(run_dir, [], None, None)
    if not metrics.is_file():
        raise FileNotFoundError(
            f"{run_dir} holds no {METRICS_FILE}: name a run's output_dir (the directory `rft train` "
            "writes), after its first step."
        )
    table = run_dir / "eval_table.json"
    return RunStatus(
        run_dir=run_dir,
        records=read_records(metrics),
        last_checkpoint=last_checkpoint(run_dir),
        eval_table=json.loads(table.read_text()) if table.is_file() else None,
    )


def _number(value: Any, spec: str) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-"
    return "nan" if math.isnan(value) else format(value, spec)


def step_table(records: list[dict[str, Any]]) -> str:
    """One row per step: reward, success, rollouts, failures, update statistics, prefix breaks, calls
    cut off by the token limit, tokens, cost, time."""
    header = (
        "| step | reward | success | rollouts ok/all | failed | KL | clip | Δlogp mean/max "
        "| prefix breaks | cut off | sampled tok | trained tok | cost $ | step s |"
    )
    lines = [header, "|---" * (header.count("|") - 1) + "|"]
    for record in records:
        rollouts, update, tokens, fidelity = (
            record.get("rollouts", {}),
            record.get("update", {}),
            record.get("tokens", {}),
            record.get("fidelity", {}),
        )
        cells = [
            str(record["step"]),
            _number(record.get("reward_mean"), ".4f"),
            _number(record.get("success_rate"), ".1%"),
            f"{rollouts.get('ok', '-')}/{rollouts.get('total', '-')}",
            str(rollouts.get("failed", "-")),
            _number(update.get("kl"), ".4f"),
            _number(update.get("clip_fraction"), ".3f"),
            f"{_number(fidelity.get('logprob_abs_diff_mean'), '.2e')}/"
            f"{_number(fidelity.get('logprob_abs_diff_max'), '.2e')}",
            str(fidelity.get("prefix_breaks", "-")),
            str(fidelity.get("truncated_calls", "-")),
            _number(tokens.get("sample"), ","),
            _number(tokens.get("train"), ","),
            _number(record.get("cost_usd_total"), ".4f"),
            _number(record.get("time_s", {}).get("step"), ".1f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(status: RunStatus, now: float) -> list[str]:
    """The lines under the table: failures by cause, tokens and dollars, last checkpoint, evaluation."""
    records = status.records
    last = records[-1]
    failures: dict[str, int] = {}
    for record in records:
        for cause, count in record.get("failures", {}).items():
            failures[cause] = failures.get(cause, 0) + int(count)
    failed = {cause: count for cause, count in failures.items() if count}
    tokens = last.get("tokens", {})
    lines = [
        f"steps: {len(records)} (last: step {last['step']}, written {now - last.get('time', now):.0f} s ago)",
        "failed rollouts by cause: "
        + (", ".join(f"{cause} {count}" for cause, count in sorted(failed.items())) or "none"),
        f"tokens: prefill {tokens.get('prefill_total', 0):,}, sample {tokens.get('sample_total', 0):,}, "
        f"train {tokens.get('train_total', 0):,}; estimated cost ${last.get('cost_usd_total', 0.0):.4f}",
    ]
    if status.last_checkpoint is not None:
        lines.append(f"last checkpoint: {status.last_checkpoint}")
    else:
        lines.append("last checkpoint: none yet")
    evaluations = [record["eval"] for record in records if record.get("eval")]
    if status.eval_table is not None:
        before, after = status.eval_table["before"], status.eval_table["after"]
        lines.append(
            f"evaluation: success {before['success_rate']:.1%} (step {before['step']}) -> "
            f"{after['success_rate']:.1%} (step {after['step']}); the run finished"
        )
    elif evaluations:
        latest = evaluations[-1]
        lines.append(f"last evaluation: step {latest['step']}, success {latest['success_rate']:.1%}")
    return lines


def render(status: RunStatus, last: int = 0, now: float | None = None) -> str:
    """The table of the last ``last`` steps (0: all) over the summary of the whole run."""
    stopped = [record for record in status.records if record.get("stopped")]
    steps = [record for record in status.records if not record.get("stopped")]
    ending = [f"the run stopped at step {record['step']}: {record['stopped']}" for record in stopped[-1:]]
    if not steps:
        return "\n".join(
            ending
            or [
                f"{status.run_dir}: the run is in its first evaluation or step (no step finished yet); "
                f"its log so far: {status.run_dir / LOG_FILE}"
            ]
        )
    status = replace(status, records=steps)
    now = time.time() if now is None else now
    shown = status.records[-last:] if last > 0 else status.records
    lines = [f"run: {status.run_dir}", ""]
    if len(shown) < len(status.records):
        lines.append(f"(the last {len(shown)} of {len(status.records)} steps; --last 0 shows all)")
    figures = [*agent_metrics_lines(status.records), *fidelity_lines(status.records)]
    return "\n".join([*lines, step_table(shown), "", *summary(status, now), *figures, *ending])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rft status", description="Show a training run's progress from its run directory."
    )
    parser.add_argument("run_dir", type=Path, help="the run's output_dir")
    parser.add_argument("--last", type=int, default=20, help="steps shown in the table; 0: all (default: 20)")
    parser.add_argument(
        "--stacks",
        action="store_true",
        help="ask the run's trainer (SIGUSR1) to write every thread's stack to train.log, and print them",
    )
    args = parser.parse_args(argv)
    if args.stacks:
        from trainer.ops.stacks import StacksError, request_stacks

        try:
            print(request_stacks(args.run_dir), end="")
        except StacksError as error:
            print(f"rft status: {error}")
            return 1
        return 0
    try:
        status = read_status(args.run_dir)
    except FileNotFoundError as error:
        print(f"rft status: {error}")
        return 2
    print(render(status, args.last))
    stall = args.run_dir / STALL_FILE
    if stall.is_file():
        print(f"\nstalled now:\n{stall.read_text()}")
    return 0
