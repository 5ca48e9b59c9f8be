"""From a step's played rollouts to its training batch: group them by row, then centre each group's
rewards into advantages carried by the rollouts' training sequences.

A failed rollout stays out of its group's statistics (never a zero reward); a group with nothing to
learn from (every reward equal, or too few scored) is dropped; a rollout whose trace cannot be turned
into training sequences is dropped and counted (``bad_traces``). A scored rollout whose trace holds no
sampled token keeps its place in the group's statistics and is counted apart (``without_sequences``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import Tensor

from policy_server import RolloutTrace
from trainer.algo.grpo import group_advantages
from trainer.algo.sequences import TrainingSequence, build_sequences
from trainer.config import TrainConfig
from trainer.rollouts.outcomes import RolloutOutcome, group_is_trainable
from trainer.rollouts.producer import PlayedRollout

log = logging.getLogger(__name__)


@dataclass
class Member:
    """A scored rollout of a group and the training sequences of its trace."""

    rollout: PlayedRollout
    sequences: list[TrainingSequence]

    @property
    def reward(self) -> float:
        assert self.rollout.outcome.reward is not None  # only scored rollouts become members
        return self.rollout.outcome.reward


@dataclass
class Group:
    """The rollouts of one row: the scored ones (members) and the failed ones' outcomes."""

    members: list[Member] = field(default_factory=list)
    failed: list[RolloutOutcome] = field(default_factory=list)

    @property
    def outcomes(self) -> list[RolloutOutcome]:
        return [member.rollout.outcome for member in self.members] + self.failed


@dataclass
class StepBatch:
    """A step's groups, the training sequences they give, and what was dropped on the way."""

    groups: list[Group] = field(default_factory=list)
    sequences: list[TrainingSequence] = field(default_factory=list)
    traces: list[RolloutTrace] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)  # of every scored rollout, in play order
    dropped_groups: int = 0
    bad_traces: int = 0
    without_sequences: int = 0  # scored rollouts whose trace holds no sampled token
    distillation: dict[str, float] = field(default_factory=dict)  # the teacher's figures, when distilling


def group_rollouts(played: list[PlayedRollout], num_groups: int) -> StepBatch:
    """The played rollouts by group, each scored one with its training sequences."""
    batch = StepBatch(groups=[Group() for _ in range(num_groups)])
    for rollout in played:
        group = batch.groups[rollout.request.group_index]
        if not rollout.outcome.ok or rollout.outcome.reward is None:
            group.failed.append(rollout.outcome)
            continue  # failed: out of the group's statistics, never a zero
        batch.rewards.append(rollout.outcome.reward)
        try:
            sequences = build_sequences(rollout.trace)
        except ValueError as error:
            batch.bad_traces += 1
            log.warning("rollout %s dropped: %s", rollout.request.rollout_id, error)
            continue
        if not sequences:
            batch.without_sequences += 1
        group.members.append(Member(rollout, sequences))
    return batch


def assign_advantages(config: TrainConfig, batch: StepBatch) -> None:
    """Advantages per trainable group (scaled as ``scale_rewards`` says), onto its members' sequences.

    While distilling (``distillation.weight > 0``) a group without reward signal still trains: its
    outcome advantages are 0 and its tokens carry the teacher's term alone.
    """
    distilling = config.distillation is not None and config.distillation.weight > 0
    centred: list[tuple[Group, Tensor]] = []
    for index, group in enumerate(batch.groups):
        check = group_is_trainable(group.outcomes)
        if not check and distilling and group.members:
            log.info("group %d has no reward signal (%s): distillation alone", index, check.reason)
            centred.append((group, torch.zeros(len(group.members), dtype=torch.float64)))
            continue
        if not check:
            batch.dropped_groups += 1
            log.info("group %d gives no gradient: %s", index, check.reason)
            continue
        rewards = torch.tensor([member.reward for member in group.members], dtype=torch.float64)
        centred.append((group, group_advantages(rewards, scale_by_std=config.scale_rewards == "group")))
    if config.scale_rewards == "batch" and centred:
        all_rewards = torch.tensor(
            [member.reward for group, _ in centred for member in group.members], dtype=torch.float64
        )
        scale = float(all_rewards.std()) + 1e-6
        centred = [(group, advantages / scale) for group, advantages in centred]
    for group, advantages in centred:
        for member, advantage in zip(group.members, advantages.tolist(), strict=True):
            for sequence in member.sequences:
                sequence.advantage = advantage
            batch.sequences += member.sequences
            batch.traces.append(member.rollout.trace)
