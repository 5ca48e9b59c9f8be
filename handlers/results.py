"""What a rollout function may return, and how each shape becomes rewards and metrics.

Accepted shapes:

- a number: the episode reward;
- a list of numbers: one reward per turn (the episode reward is their sum);
- a dict with ``reward`` (a number or a list of numbers), optional ``metrics`` (a dict of numbers; booleans
  count as 0/1) and optional ``status: "ready"``; other keys pass through to the HTTP answer;
- ``{"status": "skipped"}``: nothing is reported and no reward is recorded;
- ``{"status": "failed" | "error", "error": "..."}``: the rollout failed (not a zero reward).

Anything else (NaN, infinity, None, a string, an empty list) is a bug in the agent:
:func:`interpret_result` raises :class:`InvalidResultError` naming the problem.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from handlers.protocol import ResultStatus


class InvalidResultError(ValueError):
    """The rollout function returned something that is not a reward."""


@dataclass(frozen=True)
class RolloutResult:
    """A rollout function's return value, checked."""

    status: ResultStatus
    rewards: list[float] | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def reward(self) -> float | None:
        return math.fsum(self.rewards) if self.rewards is not None else None


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _reward(value: Any, where: str) -> float:
    if not _is_number(value):
        raise InvalidResultError(
            f"{where} must be a number, got {type(value).__name__} {value!r:.80}: return a float reward"
        )
    reward = float(value)
    if not math.isfinite(reward):
        raise InvalidResultError(f"{where} is {reward}, not a finite number: check the reward computation")
    return reward


def _rewards(value: Any, where: str) -> list[float]:
    if isinstance(value, list | tuple):
        if not value:
            raise InvalidResultError(f"{where} is an empty list: return at least one reward")
        return [_reward(item, f"{where}[{index}]") for index, item in enumerate(value)]
    return [_reward(value, where)]


def _metrics(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        raise InvalidResultError(
            f"the returned 'metrics' must be a dict of numbers, got {type(value).__name__}"
        )
    metrics: dict[str, float] = {}
    for name, metric in value.items():
        where = f"metrics[{name!r}]"
        if not isinstance(name, str):
            raise InvalidResultError(f"{where}: metric names must be strings")
        metrics[name] = float(metric) if isinstance(metric, bool) else _reward(metric, where)
    return metrics


def _from_dict(result: dict[str, Any]) -> RolloutResult:
    status = result.get("status", ResultStatus.READY.value)
    if status == ResultStatus.SKIPPED.value:
        return RolloutResult(status=ResultStatus.SKIPPED)
    if status in (ResultStatus.FAILED.value, "error"):
        message = result.get("error") or result.get("message") or "the rollout reported itself failed"
        return RolloutResult(status=ResultStatus.FAILED, error=str(message))
    if status != ResultStatus.READY.value:
        raise InvalidResultError(
            f"the returned 'status' is {status!r}: use 'ready' (or omit it), 'skipped' or 'failed'"
        )
    if "reward" not in result:
        raise InvalidResultError(
            "the returned dict has no 'reward': return {'reward': <number or list>, 'metrics': {...}}"
        )
    extras = {key: value for key, value in result.items() if key not in ("status", "reward", "metrics")}
    return RolloutResult(
        status=ResultStatus.READY,
        rewards=_rewards(result["reward"], "the returned 'reward'"),
        metrics=_metrics(result.get("metrics", {})),
        extras=extras,
    )


def interpret_result(result: Any) -> RolloutResult:
    """Check a rollout function's return value; raise :class:`InvalidResultError` if it is no reward."""
    if isinstance(result, dict):
        return _from_dict(result)
    return RolloutResult(status=ResultStatus.READY, rewards=_rewards(result, "the returned reward"))
