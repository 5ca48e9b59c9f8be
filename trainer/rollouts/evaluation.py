"""Evaluation on the validation rows: ``generations`` rollouts per row, success rate and mean reward.

Failed rollouts are counted by cause and left out of both figures, the same rule as training: an
infrastructure failure says nothing about the policy, so it is not scored as a zero.
:func:`evaluate_policy` is the one path that plays an evaluation, for `rft train` and `rft eval` alike.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from trainer.rollouts.dataset import dataset_row_name, derived_seed
from trainer.rollouts.fanout import RolloutRequest
from trainer.rollouts.outcomes import FailureCounts, RolloutOutcome, mean_agent_metrics

if TYPE_CHECKING:
    from trainer.rollouts.producer import PlayedRollout
    from trainer.session import Session


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


@dataclass
class PlayedEvaluation:
    """An evaluation's score, every rollout's outcome (row by row, in request order) and its tokens."""

    result: EvalResult
    outcomes: list[RolloutOutcome]
    prefill_tokens: int
    sample_tokens: int


def evaluate_policy(
    session: Session,
    rows: Sequence[Any],
    *,
    step: int,
    adapter_version: int,
    generations: int,
    keep: Callable[[list[PlayedRollout]], None] | None = None,
) -> PlayedEvaluation:
    """Play ``rows`` on the adapter ``session`` serves now, ``generations`` rollouts each.

    Rollout ``generation`` of row ``index`` samples with the seed ``derived_seed(seed, "eval", index,
    generation)`` at every evaluation of every run of the config: before and after sample with the
    same random numbers, so their difference is the policy's, not the dice's. ``keep`` sees the
    played rollouts (traces included) before their images are released.
    """
    config = session.config
    played: list[PlayedRollout] = []
    before = (session.eval_tokens.prefill_tokens, session.eval_tokens.sample_tokens)

    def play(requests: list[RolloutRequest]) -> list[RolloutOutcome]:
        batch = session.play(requests)
        played.extend(batch)
        session.count_eval_tokens(batch)
        return [rollout.outcome for rollout in batch]

    try:
        result = evaluate(
            rows,
            step=step,
            make_request=lambda index, row, generation: session.request(
                row,
                f"eval-{step}-{index}-{generation}-{uuid.uuid4().hex[:8]}",
                index,
                temperature=config.eval_temperature,
                seed=derived_seed(config.seed, "eval", index, generation),
                row_name=dataset_row_name(config.eval_file, index),
            ),
            play=play,
            success_threshold=config.success_threshold,
            adapter_version=adapter_version,
            generations=generations,
        )
        if keep is not None:
            keep(played)
    finally:
        session.release(played)
    return PlayedEvaluation(
        result,
        [rollout.outcome for rollout in played],
        prefill_tokens=session.eval_tokens.prefill_tokens - before[0],
        sample_tokens=session.eval_tokens.sample_tokens - before[1],
    )
