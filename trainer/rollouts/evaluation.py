"""Evaluation on the validation rows: one rollout per row, success rate and mean reward.

Failed rollouts are counted by cause and left out of both figures, the same rule as training: an
infrastructure failure says nothing about the policy, so it is not scored as a zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from trainer.rollouts.fanout import RolloutRequest
from trainer.rollouts.outcomes import FailureCounts, RolloutOutcome, mean_agent_metrics


@dataclass
class EvalResult:
    """One evaluation: after ``step`` training steps (0: before training)."""

    step: int
    success_rate: float
    mean_reward: float
    scored: int
    failed: int
    failures: dict[str, int] = field(default_factory=dict)
    failure_errors: dict[str, str] = field(default_factory=dict)  # the first error text per cause
    adapter_version: int = 0
    agent_metrics: dict[str, float] = field(default_factory=dict)  # means over the scored rollouts

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def score(
    step: int, outcomes: Sequence[RolloutOutcome], success_threshold: float, adapter_version: int = 0
) -> EvalResult:
    """Success rate (reward > ``success_threshold``) and mean reward over the rollouts that ended well."""
    rewards = [outcome.reward for outcome in outcomes if outcome.ok and outcome.reward is not None]
    failures = FailureCounts()
    failures.add(outcomes)
    return EvalResult(
        step=step,
        success_rate=sum(reward > success_threshold for reward in rewards) / len(rewards) if rewards else 0.0,
        mean_reward=math.fsum(rewards) / len(rewards) if rewards else float("nan"),
        scored=len(rewards),
        failed=len(outcomes) - len(rewards),
        failures={cause: count for cause, count in failures.as_dict().items() if count},
        failure_errors=failures.errors_dict(),
        adapter_version=adapter_version,
        agent_metrics=mean_agent_metrics(outcomes),
    )


def evaluate(
    rows: Sequence[Any],
    *,
    step: int,
    make_request: Callable[[int, Any, int], RolloutRequest],
    play: Callable[[list[RolloutRequest]], list[RolloutOutcome]],
    success_threshold: float,
    adapter_version: int = 0,
    generations: int = 1,
) -> EvalResult:
    """Play ``generations`` rollouts per row (``make_request(row_index, row, generation)``) through
    ``play`` and score them all together."""
    outcomes = play(
        [
            make_request(index, row, generation)
            for index, row in enumerate(rows)
            for generation in range(generations)
        ]
    )
    return score(step, outcomes, success_threshold, adapter_version)
