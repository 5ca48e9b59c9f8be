"""What a rollout came back as (:class:`RolloutOutcome`: ok, or failed with a cause), the failures of
a batch counted by cause, the reward of an episode an agent reported step by step, and whether a group
of outcomes has anything to learn from.

A failed rollout carries its cause and never a reward: the loop drops it from its group's statistics
instead of scoring it zero.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from handlers import ERROR_TEXT_CHARS, FailureCause
from trainer.config import RewardAggregation


@dataclass(frozen=True)
class RolloutOutcome:
    """How one rollout ended. ``reward`` is set exactly when ``status`` is ``ok``."""

    rollout_id: str
    group_index: int
    status: Literal["ok", "failed"]
    cause: FailureCause | None = None
    rewards: list[float] | None = None
    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    attempts: int = 0
    latency_s: float = 0.0
    target: str | None = None
    row_name: str | None = None  # the dataset row it played ("train.jsonl row 3"), for failure texts

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def mean_agent_metrics(outcomes: Sequence[RolloutOutcome]) -> dict[str, float]:
    """Each metric the agents reported, averaged over the successful rollouts that reported it."""
    values: dict[str, list[float]] = {}
    for outcome in outcomes:
        if outcome.ok:
            for name, value in outcome.metrics.items():
                values.setdefault(name, []).append(value)
    return {name: math.fsum(series) / len(series) for name, series in sorted(values.items())}


@dataclass
class FailureCounts:
    """Failed rollouts counted by cause, with the first error text of each cause."""

    counts: Counter[FailureCause] = field(default_factory=Counter)
    first_errors: dict[FailureCause, str] = field(default_factory=dict)

    def add(self, outcomes: Iterable[RolloutOutcome]) -> None:
        for outcome in outcomes:
            if outcome.cause is not None:
                self.counts[outcome.cause] += 1
                text = (outcome.error or "(no error text)")[:ERROR_TEXT_CHARS]
                if outcome.row_name:
                    text = f"{text} ({outcome.row_name})"
                self.first_errors.setdefault(outcome.cause, text)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, int]:
        """Every cause with its count, zeros included (stable metric columns)."""
        return {cause.value: self.counts[cause] for cause in FailureCause}

    def errors_dict(self) -> dict[str, str]:
        """The first error text of each cause seen."""
        return {cause.value: text for cause, text in self.first_errors.items()}

    def describe(self) -> str:
        """One line per cause seen: ``agent_error x15, first: HTTP 500: ...``."""
        return "; ".join(
            f"{cause.value} x{self.counts[cause]}, first: {self.first_errors[cause]}"
            for cause in FailureCause
            if self.counts[cause]
        )


def aggregate_rewards(rewards: Sequence[float], how: RewardAggregation) -> float:
    """The episode reward of a per-turn list: its sum, its last value or its mean."""
    if not rewards:
        raise ValueError("cannot aggregate an empty reward list")
    if how == "sum":
        return math.fsum(rewards)
    if how == "last":
        return float(rewards[-1])
    return math.fsum(rewards) / len(rewards)


def resolve_reward(
    outcome: RolloutOutcome, trace_rewards: list[float] | None, aggregation: RewardAggregation = "sum"
) -> RolloutOutcome:
    """Fill in the reward from ``update-reward`` (the trace) when the answer carried none.

    The ``/invocations`` answer wins when it has a reward; only a ``no_report`` outcome changes.
    """
    if outcome.cause != FailureCause.NO_REPORT or not trace_rewards:
        return outcome
    if not all(math.isfinite(reward) for reward in trace_rewards):
        return replace(outcome, cause=FailureCause.BAD_REWARD, error=f"update-reward sent {trace_rewards}")
    return replace(
        outcome,
        status="ok",
        cause=None,
        error=None,
        rewards=list(trace_rewards),
        reward=aggregate_rewards(trace_rewards, aggregation),
    )


@dataclass(frozen=True)
class GroupCheck:
    """Whether a group gives a gradient; false with a reason when it does not."""

    trainable: bool
    reason: str | None = None

    def __bool__(self) -> bool:
        return self.trainable


def group_is_trainable(outcomes: Sequence[RolloutOutcome]) -> GroupCheck:
    """A group trains only with two or more valid rollouts whose rewards differ."""
    rewards = [outcome.reward for outcome in outcomes if outcome.ok and outcome.reward is not None]
    if len(rewards) < 2:
        reason = f"only {len(rewards)} valid rollout(s) of {len(outcomes)}"
        failures = FailureCounts()
        failures.add(outcomes)
        return GroupCheck(False, f"{reason} ({failures.describe()})" if failures.total else reason)
    if max(rewards) - min(rewards) == 0.0:
        return GroupCheck(False, f"no reward variance (all {len(rewards)} rewards are {rewards[0]:g})")
    return GroupCheck(True)
