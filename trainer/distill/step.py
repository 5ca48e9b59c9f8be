"""One GRPO step's distillation: the teacher scores the batch, and each sequence gets per-token
advantages (:func:`trainer.algo.distill.distillation_advantages`) in place of its one outcome advantage."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import torch

from trainer.algo.distill import distillation_advantages, reverse_kl
from trainer.algo.sequences import TrainingSequence
from trainer.config import DistillationConfig

log = logging.getLogger(__name__)


class Scorer(Protocol):
    """A teacher: a local model (:class:`~trainer.distill.teacher.Teacher`) or a vLLM server
    (:class:`~trainer.distill.endpoint.EndpointTeacher`)."""

    def score(self, sequences: Sequence[TrainingSequence]) -> list[torch.Tensor]:
        """Its logprob of each sequence's tokens, one 1-D float32 CPU tensor per sequence (0 off the
        loss mask), in ``sequences``' order."""
        ...


def distill_sequences(
    teacher: Scorer, settings: DistillationConfig, sequences: Sequence[TrainingSequence]
) -> dict[str, float]:
    """Score ``sequences`` with the teacher and set their ``token_advantages``; the step's figures:
    ``reverse_kl`` (mean over sampled tokens of student minus teacher logprob, the sampler's logprob
    for the student's), ``teacher_logprob`` (its mean), ``teacher_tokens`` (every token the teacher
    read: its prefill) and ``sampled_tokens``."""
    if not sequences:
        return {"reverse_kl": float("nan"), "teacher_logprob": float("nan"), "teacher_tokens": 0.0}
    kl_sum = teacher_sum = tokens = 0.0
    for sequence, teacher_logprobs in zip(sequences, teacher.score(sequences), strict=True):
        mask = torch.tensor([sequence.loss_mask], dtype=torch.float32)
        student = torch.tensor([sequence.behavior_logprobs], dtype=torch.float32)
        scored = teacher_logprobs.unsqueeze(0)
        advantages = distillation_advantages(
            torch.tensor([sequence.advantage]),
            student,
            scored,
            mask,
            weight=settings.weight,
            reward_weight=settings.reward_weight,
        )
        sequence.token_advantages = advantages[0].tolist()
        kl_sum += float(reverse_kl(student, scored, mask).sum())
        teacher_sum += float((scored * mask).sum())
        tokens += float(mask.sum())
    return {
        "reverse_kl": kl_sum / max(tokens, 1.0),
        "teacher_logprob": teacher_sum / max(tokens, 1.0),
        "teacher_tokens": float(sum(len(sequence) for sequence in sequences)),
        "sampled_tokens": tokens,
    }
