"""Rollouts played off the learner's thread: an event loop of their own, one future per step.

The learner keeps the main thread; the fan-out (HTTP to the agents) runs on a :class:`LoopThread`.
Each step's rollouts are submitted together, pinned to one adapter version of the policy server
(:meth:`PolicyServer.open_rollout`), and played concurrently with whatever else is in flight: the
rollouts of other steps, the learner's update. Results land in request order, whatever order the
rollouts finish in, and a snapshot of the finished ones can be taken at any time (checkpoints).
When to submit which step is :mod:`trainer.rollouts.pipeline`'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TypeVar

from handlers import LoopThread
from policy_server import PolicyServer, Rejection, RolloutTrace
from trainer.config import RewardAggregation
from trainer.rollouts.fanout import FailureCause, Fanout, RolloutRequest
from trainer.rollouts.outcomes import RolloutOutcome, resolve_reward
from trainer.rollouts.refusals import check_model_calls

ResultT = TypeVar("ResultT")


@dataclass
class PlayedRollout:
    """A rollout's request, how it ended (reward resolved) and the tokens its calls recorded."""

    request: RolloutRequest
    outcome: RolloutOutcome
    trace: RolloutTrace


@dataclass
class StepRollouts:
    """One step's rollouts: submitted together, all sampled on one adapter version."""

    step: int
    adapter_version: int  # the trainer's numbering (0: the base model)
    row_indices: list[int]
    requests: list[RolloutRequest]
    played: list[PlayedRollout | None]
    submitted_at: float = field(default_factory=time.monotonic)
    finished_at: float | None = None
    future: Future[None] | None = None

    def finished(self) -> dict[int, PlayedRollout]:
        """The rollouts done so far, by their position in the step (what a checkpoint keeps)."""
        return {index: played for index, played in enumerate(list(self.played)) if played is not None}

    def wait(self) -> list[PlayedRollout]:
        """Block until every rollout of the step is done; their results in request order."""
        if self.future is not None:
            self.future.result()
        assert all(played is not None for played in self.played)
        return [played for played in self.played if played is not None]

    @property
    def seconds(self) -> float:
        """From submission to the last rollout's end: the rollouts' own wall time."""
        return (self.finished_at or time.monotonic()) - self.submitted_at


class RolloutProducer:
    """Opens, plays and collects rollouts of one job on its own event loop."""

    def __init__(
        self, server: PolicyServer, fanout: Fanout, job_arn: str, reward_aggregation: RewardAggregation
    ) -> None:
        self.server = server
        self.fanout = fanout
        self.job_arn = job_arn
        self.reward_aggregation: RewardAggregation = reward_aggregation
        self._loop = LoopThread("rftkit rollouts")

    def start(self) -> None:
        self._loop.start()

    def close(self) -> None:
        self._loop.close(self.fanout.aclose)

    def fail_stalled(self, rollout_ids: Sequence[str], error: str) -> int:
        """Fail these rollouts, where still playing, by cause ``stalled``; how many were."""
        return self._loop.run(self.fanout.fail_stalled(rollout_ids, error), timeout=30)

    def submit(self, rollouts: StepRollouts, server_version: int | None) -> StepRollouts:
        """Open the step's unfinished rollouts pinned to ``server_version`` and start playing them.

        ``None`` pins nothing: each call samples on the version current when it arrives.
        """
        todo = [index for index, played in enumerate(rollouts.played) if played is None]
        for index in todo:
            self.server.open_rollout(self.job_arn, rollouts.requests[index].rollout_id, server_version)
        rollouts.future = self._loop.submit(self._play_all(rollouts, todo))
        return rollouts

    def play(self, requests: Sequence[RolloutRequest]) -> list[PlayedRollout]:
        """Play ``requests`` now, each call on the then-current version; results in request order."""
        rollouts = StepRollouts(0, 0, [], list(requests), [None] * len(requests))
        return self.submit(rollouts, None).wait()

    async def _play_all(self, rollouts: StepRollouts, todo: list[int]) -> None:
        await asyncio.gather(*(self._play_one(rollouts, index) for index in todo))
        rollouts.finished_at = time.monotonic()

    async def _play_one(self, rollouts: StepRollouts, index: int) -> None:
        request = rollouts.requests[index]
        outcome = await self.fanout.run_one(request)
        try:
            trace = self.server.take_trace(self.job_arn, request.rollout_id)
        except Rejection as rejection:
            # Only the trainer takes traces; should one be gone anyway, that rollout fails (it has no
            # tokens to train on) and the run goes on.
            trace = RolloutTrace(job_arn=self.job_arn, rollout_id=request.rollout_id)
            outcome = _trace_lost(outcome, rejection.message)
        outcome = check_model_calls(resolve_reward(outcome, trace.rewards, self.reward_aggregation), trace)
        rollouts.played[index] = PlayedRollout(request, outcome, trace)


def _trace_lost(outcome: RolloutOutcome, message: str) -> RolloutOutcome:
    return dataclasses.replace(
        outcome,
        status="failed",
        cause=FailureCause.AGENT_ERROR,
        reward=None,
        rewards=None,
        error=f"the rollout's trace could not be taken: {message}",
    )
