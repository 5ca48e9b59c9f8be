"""What `rft status` shows under its table about the policy itself: the agents' own metrics (the mean
of each metric they reported, latest step and latest evaluation) and the fidelity figures of
:mod:`trainer.fidelity` (latest step; unparsed tool calls and calls cut off by the token limit over
the whole run too)."""

from __future__ import annotations

import math
from typing import Any


def agent_metrics_lines(records: list[dict[str, Any]]) -> list[str]:
    """The agents' metrics of the latest step and of the latest evaluation, where they reported any."""
    lines = []
    steps = [record for record in records if "agent_metrics" in record]
    if steps:
        lines.append(f"agent metrics, step {steps[-1]['step']}: {_means(steps[-1]['agent_metrics'])}")
    evaluations = [record["eval"] for record in records if record.get("eval")]
    if evaluations and "agent_metrics" in evaluations[-1]:
        latest = evaluations[-1]
        lines.append(f"agent metrics, evaluation at step {latest['step']}: {_means(latest['agent_metrics'])}")
    return lines


def fidelity_lines(records: list[dict[str, Any]]) -> list[str]:
    """The latest step's fidelity figures and the run's unparsed-tool-call share."""
    measured = [record for record in records if record.get("fidelity")]
    if not measured:
        return []
    last = measured[-1]
    figures = last["fidelity"]
    parts = []
    if "logprob_abs_diff_mean" in figures:  # absent when the step trained nothing
        figure = {name: _g(figures.get(name)) for name in figures}
        parts.append(
            f"|Δlogp| mean {figure['logprob_abs_diff_mean']} max {figure.get('logprob_abs_diff_max', '-')}, "
            f"worst sequence {figure.get('worst_sequence_abs_diff', '-')}; ratio min/mean/max "
            f"{figure.get('ratio_min', '-')}/{figure.get('ratio_mean', '-')}/{figure.get('ratio_max', '-')}, "
            f"outside the clip {_percent(figures.get('outside_clip_fraction'))}"
        )
    parts.append(
        f"prefix breaks {figures.get('prefix_breaks', 0)} "
        f"({_percent(figures.get('prefix_break_fraction'))} of continuation calls)"
    )
    parts.append(
        f"unparsed tool calls {figures.get('unparsed_tool_calls', 0)} of {figures.get('calls', 0)} calls "
        f"({_percent(figures.get('unparsed_tool_call_fraction'))})"
    )
    parts.append(
        f"calls cut off by the token limit {figures.get('truncated_calls', 0)} "
        f"({_percent(figures.get('truncated_call_fraction'))}; before an answer "
        f"{figures.get('truncated_unanswered_calls', 0)})"
        + (f", first: {figures['truncated_where'][0]}" if figures.get("truncated_where") else "")
    )
    unparsed = sum(int(record["fidelity"].get("unparsed_tool_calls", 0)) for record in measured)
    cut = sum(int(record["fidelity"].get("truncated_calls", 0)) for record in measured)
    calls = sum(int(record["fidelity"].get("calls", 0)) for record in measured)
    return [
        f"fidelity, step {last['step']}: " + "; ".join(parts),
        f"unparsed tool calls over the run: {unparsed} of {calls} calls "
        f"({_percent(unparsed / calls if calls else 0.0)})",
        f"calls cut off by the token limit over the run: {cut} of {calls} calls "
        f"({_percent(cut / calls if calls else 0.0)})",
    ]


def _means(metrics: dict[str, Any]) -> str:
    return ", ".join(f"{name} {_g(value)}" for name, value in sorted(metrics.items())) or "none reported"


def _g(value: Any) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-"
    return "nan" if math.isnan(value) else format(value, ".4g")


def _percent(value: Any) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value):
        return "-"
    return f"{value:.1%}"
