"""Calls cut off by the token limit (issue 49, item 4): counted per step with where they are, shown by
`rft status`, and a step where most calls were cut off before answering stops the run."""

from __future__ import annotations

import pytest

from policy_server import CallRecord, RolloutTrace
from trainer.config import FidelityConfig
from trainer.errors import TrainingError
from trainer.fidelity import check_fidelity, step_fidelity
from trainer.ops.run_figures import fidelity_lines
from trainer.ops.status import step_table
from trainer.rollouts.fanout import RolloutRequest
from trainer.rollouts.outcomes import RolloutOutcome
from trainer.rollouts.producer import PlayedRollout


def _call(index: int, *, truncated: bool, answered: bool = True) -> CallRecord:
    return CallRecord(
        index=index,
        prompt_token_ids=[1, 2],
        completion_token_ids=[3, 4],
        completion_logprobs=[-0.5, -0.5],
        adapter_version=0,
        finish_reason="length" if truncated else "stop",
        started_at=0.0,
        finished_at=0.0,
        truncated=truncated,
        answered=answered,
    )


def _played(rollout_id: str, row: int, calls: list[CallRecord]) -> PlayedRollout:
    request = RolloutRequest(
        row={"q": row},
        rollout_id=rollout_id,
        group_index=0,
        job_arn="job",
        endpoint="http://x",
        row_name=f"train.jsonl row {row}",
        row_index=row - 1,
    )
    outcome = RolloutOutcome(rollout_id=rollout_id, group_index=0, status="ok", rewards=[0.0], reward=0.0)
    return PlayedRollout(request, outcome, RolloutTrace(job_arn="job", rollout_id=rollout_id, calls=calls))


def test_truncated_calls_are_counted_with_their_rows_and_shown_by_status() -> None:
    played = [
        _played("r0", 3, [_call(0, truncated=False), _call(1, truncated=True, answered=False)]),
        _played("r1", 5, [_call(0, truncated=True), _call(1, truncated=False)]),
    ]
    figures = step_fidelity({}, played)
    assert figures["truncated_calls"] == 2 and figures["truncated_call_fraction"] == 0.5
    assert figures["truncated_unanswered_calls"] == 1 and figures["truncated_unanswered_fraction"] == 0.25
    assert figures["truncated_where"] == [
        "train.jsonl row 3, rollout r0, call 1",
        "train.jsonl row 5, rollout r1, call 0",
    ]
    record = {"step": 1, "fidelity": figures}
    assert "| prefix breaks | cut off |" in step_table([record]) and "| -/- | 2 | 2 |" in step_table([record])
    lines = fidelity_lines([record])
    assert (
        "calls cut off by the token limit 2 (50.0%; before an answer 1), first: train.jsonl row 3, "
        "rollout r0, call 1" in lines[0]
    )
    assert lines[-1] == "calls cut off by the token limit over the run: 2 of 4 calls (50.0%)"
    check_fidelity(FidelityConfig(), 1, figures)  # a quarter cut off before answering: under the default


def test_a_step_whose_calls_are_cut_off_before_answering_stops_the_run_naming_them() -> None:
    played = [_played(f"r{i}", i, [_call(0, truncated=True, answered=False)]) for i in range(1, 4)]
    played.append(_played("r9", 9, [_call(0, truncated=False)]))
    figures = step_fidelity({}, played)
    with pytest.raises(TrainingError) as stopped:
        check_fidelity(FidelityConfig(), 2, figures)
    assert str(stopped.value) == (
        "step 2: sampling cuts calls off before they answer: fidelity truncated_unanswered_fraction is 0.75, "
        "above fidelity.max_truncated_unanswered_fraction (0.5); max_completion_length ends them while the "
        "model still reasons: raise max_completion_length, or set a lower reasoning_effort where the "
        "model's family has one (rft plan says what its reasoning needs); cut off: train.jsonl row 1, "
        "rollout r1, call 0; train.jsonl row 2, rollout r2, call 0; train.jsonl row 3, rollout r3, call 0. "
        "The step's figures are in metrics.jsonl under 'fidelity' (docs/fidelity.md); fidelity.enabled: "
        "false only measures them."
    )
    check_fidelity(FidelityConfig(max_truncated_unanswered_fraction=None), 2, figures)
