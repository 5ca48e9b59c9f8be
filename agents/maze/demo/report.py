"""What the demo shows at the end: the before/after tables and the progress plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_progress(history: list[dict[str, Any]], evaluations: list[dict[str, Any]], path: Path) -> Path:
    """Training reward per step and evaluation success rate, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    steps = [record["step"] for record in history]
    axis.plot(
        steps, [record["reward_mean"] for record in history], marker=".", label="training reward (mean)"
    )
    axis.plot(
        [evaluation["step"] for evaluation in evaluations],
        [evaluation["success_rate"] for evaluation in evaluations],
        marker="o",
        label="evaluation success rate",
    )
    axis.set_xlabel("GRPO step")
    axis.set_ylim(-0.02, 1.02)
    axis.set_title("maze: reward and success over steps")
    axis.legend(loc="lower right")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def result_table(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Success rate, mean reward and the maze agent's own metrics, before and after GRPO."""
    rows = [
        ("", "before", "after"),
        ("success rate", f"{before['success_rate']:.1%}", f"{after['success_rate']:.1%}"),
        ("mean reward", f"{before['mean_reward']:.3f}", f"{after['mean_reward']:.3f}"),
    ]
    labels = {"moves": "moves", "stopped": "stopped early"}
    for name, label in labels.items():
        if name in before.get("agent_metrics", {}) and name in after.get("agent_metrics", {}):
            rows.append(
                (label, f"{before['agent_metrics'][name]:.2f}", f"{after['agent_metrics'][name]:.2f}")
            )
    return "\n".join(f"{name:<14}{left:>10}{right:>10}" for name, left, right in rows)


def reachable_table(before: dict[str, Any], after: dict[str, Any], walkers: dict[str, float]) -> str:
    """The policy next to what is possible on the same mazes, and the share of the gap GRPO closed."""
    labels = {
        "random": "random walker",
        "greedy": "greedy walker (a Closer move when there is one)",
        "noisy": "noisy walker the warm start learns from",
        "observation": "best observation-only policy found (a lower bound)",
        "oracle": "shortest-path oracle",
    }
    lines = [f"{label:<52}{walkers[name]:>7.1%}" for name, label in labels.items()]
    lines.insert(3, f"{'policy before GRPO':<52}{before['success_rate']:>7.1%}")
    lines.insert(4, f"{'policy after GRPO':<52}{after['success_rate']:>7.1%}")
    gap = walkers["observation"] - before["success_rate"]
    closed = (after["success_rate"] - before["success_rate"]) / gap if gap > 0 else float("nan")
    lines.append(f"GRPO closed {closed:.0%} of the gap to the best observation-only policy")
    return "\n".join(lines)
