"""What every row of the family matrix (docs/models.md) shares: its GRPO run's settings beside the
demo's, what a row asks of its two steps, and the figures it reports (test_family_matrix.py's Wordle
rows, test_family_matrix_maze.py's picture row)."""

from __future__ import annotations

import json
from typing import Any

from trainer.config import TrainConfig


def measured(config: TrainConfig, **fields: Any) -> TrainConfig:
    """A demo's GRPO config as a matrix row runs it: no evaluation, the unparsed-call share and the
    share of calls cut off before answering (a weak warm start may still reason past the limit)
    measured rather than a stop (test_family_matrix.py's wrong-parser run keeps the default limit);
    ``fields`` override."""
    overrides = {
        "eval_on_start": False,
        "eval_on_end": False,
        "fidelity": {"max_unparsed_tool_call_fraction": None, "max_truncated_unanswered_fraction": None},
        **fields,
    }
    return TrainConfig.model_validate({**config.model_dump(), **overrides})


def check_update_hot_loaded(records: list[dict[str, Any]], max_abs_diff: float = 1e-3) -> None:
    """The first update trained sampled tokens at the sampler's logprobs (within ``max_abs_diff``:
    either engine in float32 on the CPU agrees within 1e-3), was applied and its adapter hot-loaded:
    the second step sampled with it."""
    first, second = records
    assert first["fidelity"]["logprob_abs_diff_max"] < max_abs_diff
    assert first["adapter_version"] > max(first["sampled_adapter_versions"])
    assert second["sampled_adapter_versions"] == [first["adapter_version"]]


def step_records(config: TrainConfig) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (config.output_dir / "metrics.jsonl").read_text().splitlines()]


def matrix_row(records: list[dict[str, Any]], played: str = "tool_calls") -> dict[str, Any]:
    """What the matrix reports of a run: per step, calls, parse, fidelity figures, merge. ``played``:
    the agent's metric that counts the calls it played (Wordle's ``tool_calls``, the maze's ``moves``)."""
    keep = ("calls", "unparsed_tool_call_fraction", "prefix_breaks", "prefix_break_fraction")
    return {
        "steps": [
            {
                "step": record["step"],
                "adapter_version": record["adapter_version"],
                "sampled_adapter_versions": record["sampled_adapter_versions"],
                "rollouts": record["rollouts"]["total"],
                # Calls the agent played per episode: each one a call the engine parsed.
                "calls_played_per_episode": record["agent_metrics"][played],
                "merge_ratio": round(record["tokens"]["merge_ratio"], 4),
                **{key: record["fidelity"][key] for key in keep},
                **{
                    key: round(value, 6)
                    for key, value in record["fidelity"].items()
                    if key not in keep and isinstance(value, float)
                },
            }
            for record in records
        ]
    }
