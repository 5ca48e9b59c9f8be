"""Training/sampling fidelity of one micro-batch: how far the learner's logprobs of the sampled tokens
are from the sampler's, as metrics :class:`trainer.learner.steps.GradientSums` adds up over a step.

Computed from tensors the loss already has (no gradient, no RNG, after the loss), so they change no
training number. Names end in ``_max`` / ``_min`` where a step keeps the extreme over micro-batches;
the others are token means, weighted by each micro-batch's tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

# The prefix of the learner's fidelity metrics in a step's update metrics.
FIDELITY_PREFIX = "fidelity_"


@torch.no_grad()
def fidelity_metrics(
    logprobs: Tensor, behavior_logprobs: Tensor, loss_mask: Tensor, *, epsilon: float, epsilon_high: float
) -> dict[str, float]:
    """Per-token |sampler - learner| logprob (mean, max), the worst sequence's mean, the
    sampler-to-learner ratio ``exp(learner - sampler)`` (mean, min, max) and the share of tokens whose
    ratio lies outside the clip range ``[1 - epsilon, 1 + epsilon_high]``, over the masked tokens.

    ``logprobs``: [B, T] the learner's (any grad is dropped); ``behavior_logprobs``: [B, T] the
    sampler's recorded ones; ``loss_mask``: [B, T] 1 on sampled tokens.
    """
    mask = loss_mask.to(torch.float64)
    on = mask > 0
    if not bool(on.any()):
        return {}
    difference = torch.where(on, logprobs.detach().double() - behavior_logprobs.double(), 0.0)
    absolute = difference.abs()
    ratio = torch.exp(difference)
    tokens = mask.sum()
    per_sequence = absolute.sum(-1) / mask.sum(-1).clamp(min=1.0)
    outside = ((ratio < 1.0 - epsilon) | (ratio > 1.0 + epsilon_high)) & on
    p = FIDELITY_PREFIX
    return {
        f"{p}abs_diff_mean": float(absolute.sum() / tokens),
        f"{p}abs_diff_max": float(absolute[on].max()),
        f"{p}sequence_abs_diff_max": float(per_sequence[mask.sum(-1) > 0].max()),
        f"{p}ratio_mean": float((ratio * mask).sum() / tokens),
        f"{p}ratio_min": float(ratio[on].min()),
        f"{p}ratio_max": float(ratio[on].max()),
        f"{p}outside_clip_fraction": float(outside.double().sum() / tokens),
    }
