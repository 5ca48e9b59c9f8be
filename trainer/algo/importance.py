"""The sampler-to-learner importance weights of TRL's ``vllm_importance_sampling_*`` modes: how much
each token's (or sequence's) policy loss counts when the learner's old policy, not the sampler, is
the old policy of the clipped ratio (:func:`trainer.algo.grpo.grpo_loss`)."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

ImportanceSamplingMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
IMPORTANCE_SAMPLING_MODES: tuple[str, ...] = typing.get_args(ImportanceSamplingMode)


@dataclass(frozen=True)
class ImportanceWeights:
    """The sampler-to-learner correction of one batch: per-token weights and what they came from.

    ``weight``: [B, T] the factor on each token's policy loss; ``ratio``: [B, T] the raw ratio before
    the cap (a sequence mode's one ratio per sequence, repeated on its tokens); ``capped``: [B, T] bool,
    True where the cap truncated or masked the ratio. All three are meaningful only where the loss
    mask is 1.
    """

    weight: Tensor
    ratio: Tensor
    capped: Tensor


def sampler_importance_weights(
    old_logprobs: Tensor,
    behavior_logprobs: Tensor,
    loss_mask: Tensor,
    *,
    mode: ImportanceSamplingMode = "token_truncate",
    cap: float = 3.0,
) -> ImportanceWeights:
    """Importance weights of the learner's old policy over the sampler's, as TRL's modes define them.

    The per-token ratio is ``exp(old_logprobs - behavior_logprobs)``. ``token_*`` modes keep one ratio
    per token; ``sequence_*`` modes take one per sequence, the product of its tokens' ratios
    (``exp`` of the summed log-ratios). ``*_truncate`` caps a ratio at ``cap`` (truncated importance
    sampling, Yao et al. 2025); ``*_mask`` sets a ratio above ``cap`` to 0, dropping that token or
    sequence from the policy loss. No gradient flows through the weights.
    """
    if mode not in IMPORTANCE_SAMPLING_MODES:
        raise ValueError(f"importance sampling mode must be one of {IMPORTANCE_SAMPLING_MODES}, got {mode!r}")
    if cap <= 0:
        raise ValueError(f"importance sampling cap must be positive, got {cap}")
    mask = loss_mask.to(old_logprobs.dtype)
    difference = (old_logprobs - behavior_logprobs).detach()
    log_ratio = torch.where(mask > 0, difference, torch.zeros_like(difference))
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand_as(mask)
    ratio = torch.exp(log_ratio)
    capped = ratio > cap
    if mode.endswith("truncate"):
        weight = torch.clamp(ratio, max=cap)
    else:
        weight = torch.where(capped, torch.zeros_like(ratio), ratio)
    return ImportanceWeights(weight=weight, ratio=ratio, capped=capped)
