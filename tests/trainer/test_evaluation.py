"""Evaluation scoring: success rate, mean reward, failures and agent metrics over several rollouts per row."""

from __future__ import annotations

from typing import Any

import pytest

from trainer.rollouts.evaluation import evaluate
from trainer.rollouts.fanout import FailureCause, RolloutRequest
from trainer.rollouts.outcomes import RolloutOutcome, mean_agent_metrics


def _request(index: int, row: Any, generation: int) -> RolloutRequest:
    return RolloutRequest(
        row=row,
        rollout_id=f"{index}-{generation}",
        group_index=index,
        job_arn="arn:aws:sagemaker:us-west-2:123456789012:training-job/eval",
        endpoint="http://127.0.0.1:1/v1",
    )


def _outcome(request: RolloutRequest) -> RolloutOutcome:
    # Row "a" wins on its first rollout only; row "b" always loses; row "c"'s second rollout fails.
    row, generation = request.row, int(request.rollout_id.split("-")[1])
    if row == "c" and generation == 1:
        return RolloutOutcome(request.rollout_id, request.group_index, "failed", cause=FailureCause.TIMEOUT)
    reward = 1.0 if (row == "a" and generation == 0) else 0.0
    return RolloutOutcome(
        request.rollout_id,
        request.group_index,
        "ok",
        rewards=[reward],
        reward=reward,
        metrics={"moves": 2.0 + generation},
    )


def test_every_row_is_played_generations_times_and_scored_together() -> None:
    played: list[RolloutRequest] = []

    def play(requests: list[RolloutRequest]) -> list[RolloutOutcome]:
        played.extend(requests)
        return [_outcome(request) for request in requests]

    result = evaluate(
        ["a", "b", "c"], step=4, make_request=_request, play=play, success_threshold=0.5, generations=2
    )
    assert [request.rollout_id for request in played] == ["0-0", "0-1", "1-0", "1-1", "2-0", "2-1"]
    # 5 scored rollouts (one timed out), one of them a win.
    assert (result.step, result.scored, result.failed) == (4, 5, 1)
    assert result.success_rate == pytest.approx(1 / 5) and result.mean_reward == pytest.approx(1 / 5)
    assert result.failures == {"timeout": 1}
    # moves: 2, 3, 2, 3, 2 over the scored rollouts; the failed one reported none.
    assert result.agent_metrics == {"moves": pytest.approx(12 / 5)}


def test_agent_metrics_average_each_name_over_the_rollouts_that_reported_it() -> None:
    outcomes = [
        RolloutOutcome("r0", 0, "ok", rewards=[1.0], reward=1.0, metrics={"moves": 4.0, "stopped": 0.0}),
        RolloutOutcome("r1", 0, "ok", rewards=[0.0], reward=0.0, metrics={"moves": 1.0}),
        RolloutOutcome("r2", 0, "failed", cause=FailureCause.AGENT_ERROR, metrics={"moves": 100.0}),
    ]
    assert mean_agent_metrics(outcomes) == {"moves": 2.5, "stopped": 0.0}
    assert mean_agent_metrics([]) == {}
