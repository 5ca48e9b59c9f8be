"""What `rft eval` leaves: ``eval.json`` (every figure, every row's rewards), the console table
(also ``eval.md``) and ``eval.png`` (success rate and mean reward per policy, with their intervals)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from trainer.config import TrainConfig
from trainer.evaluate.policies import BASE, PolicyResult
from trainer.evaluate.stats import INTERVAL_METHOD, paired_difference, pooled, successes
from trainer.ops.metrics import strict_json
from trainer.rollouts.dataset import dataset_row_name

REPORT_FILE = "eval.json"
TABLE_FILE = "eval.md"
PLOT_FILE = "eval.png"


def policy_record(policy: PolicyResult, rows: int, threshold: float) -> dict[str, Any]:
    """One policy's figures: the evaluation as `rft train` records it, intervals, tokens and cost."""
    rewards = policy.row_rewards(rows)
    result = policy.played.result.as_dict()
    for key in ("step", "adapter_version"):  # a run's bookkeeping, meaningless here
        result.pop(key)
    return {
        "name": policy.name,
        "adapter": str(policy.adapter) if policy.adapter is not None else None,
        **result,
        "success": pooled(successes(rewards, threshold)).as_dict(),
        "reward": pooled(rewards).as_dict(),
        "tokens": {"prefill": policy.cost.prefill_tokens, "sample": policy.cost.sample_tokens},
        "cost_usd": policy.cost.dollars,
    }


def difference_record(
    policy: PolicyResult, base: PolicyResult, rows: int, threshold: float
) -> dict[str, Any]:
    """``policy`` against the base, paired by row: success and mean reward."""
    mine, theirs = policy.row_rewards(rows), base.row_rewards(rows)
    return {
        "name": policy.name,
        "against": base.name,
        "success": paired_difference(successes(mine, threshold), successes(theirs, threshold)).as_dict(),
        "reward": paired_difference(mine, theirs).as_dict(),
    }


def build_report(
    config: TrainConfig, config_path: str, policies: list[PolicyResult], rows: int, samples: int
) -> dict[str, Any]:
    """Everything `rft eval` measured, as ``eval.json`` holds it (NaN written as null)."""
    threshold = config.success_threshold
    base = next((policy for policy in policies if policy.name == BASE), None)
    per_row = [
        {
            "row": dataset_row_name(config.eval_file, index),
            "rewards": {policy.name: policy.row_rewards(rows)[index] for policy in policies},
        }
        for index in range(rows)
    ]
    report = {
        "config": config_path,
        "eval_file": str(config.eval_file),
        "rows": rows,
        "samples": samples,
        "temperature": config.eval_temperature,
        "seed": config.seed,
        "success_threshold": threshold,
        "interval": INTERVAL_METHOD,
        "policies": [policy_record(policy, rows, threshold) for policy in policies],
        "differences": [
            difference_record(policy, base, rows, threshold)
            for policy in policies
            if base is not None and policy is not base
        ],
        "tokens": {
            "prefill": sum(policy.cost.prefill_tokens for policy in policies),
            "sample": sum(policy.cost.sample_tokens for policy in policies),
        },
        "cost_usd": math.fsum(policy.cost.dollars for policy in policies),
        "per_row": per_row,
    }
    return strict_json(report)


def _interval(figure: dict[str, Any], percent: bool, signed: bool = False) -> str:
    def shown(value: float | None) -> str:
        if value is None:
            return "n/a"
        sign = "+" if signed else ""
        return f"{value * 100:{sign}.1f}%" if percent else f"{value:{sign}.4f}"

    bounds = "" if figure["low"] is None else f" [{shown(figure['low'])}, {shown(figure['high'])}]"
    return f"{shown(figure['estimate'])}{bounds}"


def table(report: dict[str, Any]) -> str:
    """The console table: each policy's success and mean reward, its difference from the base, tokens."""
    differences = {difference["name"]: difference for difference in report["differences"]}
    lines = [
        f"{report['rows']} rows x {report['samples']} samples, temperature {report['temperature']}, "
        f"seed {report['seed']}; success: reward > {report['success_threshold']}; "
        f"intervals: {report['interval']}",
        "",
        "| policy | success | mean reward | scored / failed | success vs base | reward vs base "
        "| tokens | cost |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for policy in report["policies"]:
        difference = differences.get(policy["name"])
        versus = (
            (_interval(difference["success"], True, True), _interval(difference["reward"], False, True))
            if difference is not None
            else ("", "")
        )
        cells = [
            policy["name"],
            _interval(policy["success"], True),
            _interval(policy["reward"], False),
            f"{policy['scored']} / {policy['failed']}",
            *versus,
            f"{policy['tokens']['prefill'] + policy['tokens']['sample']:,}",
            f"${policy['cost_usd']:.4f}",
        ]
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> Path:
    """Success rate and mean reward per policy, each with its interval as an error bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [policy["name"] for policy in report["policies"]]
    figure, axes = plt.subplots(1, 2, figsize=(4 + 1.2 * len(names), 4))
    for axis, key, title in zip(axes, ("success", "reward"), ("success rate", "mean reward"), strict=True):
        figures = [policy[key] for policy in report["policies"]]
        estimates = [_number(figure["estimate"]) for figure in figures]
        pairs = list(zip(estimates, figures, strict=True))
        errors = [
            [estimate - _number(figure["low"], estimate) for estimate, figure in pairs],
            [_number(figure["high"], estimate) - estimate for estimate, figure in pairs],
        ]
        axis.bar(range(len(names)), estimates, yerr=errors, capsize=6, color="tab:blue", alpha=0.8)
        axis.set_xticks(range(len(names)), [_label(name) for name in names], rotation=20)
        axis.set_title(title)
        axis.grid(axis="y", alpha=0.3)
    figure.suptitle(f"{report['rows']} rows x {report['samples']} samples, 95% intervals over rows")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _label(name: str) -> str:
    """A policy's name short enough for the plot's axis: an adapter path's end."""
    return name if len(name) <= 24 else f"...{name[-21:]}"


def _number(value: float | None, default: float = 0.0) -> float:
    """A figure of the report, with ``default`` where it is undefined (null)."""
    return default if value is None else float(value)


def write_report(report: dict[str, Any], out: Path) -> str:
    """``eval.json``, ``eval.md`` and ``eval.png`` in ``out``; the table, to print."""
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT_FILE).write_text(json.dumps(report, indent=1, allow_nan=False))
    text = table(report)
    (out / TABLE_FILE).write_text(text)
    plot(report, out / PLOT_FILE)
    return text
