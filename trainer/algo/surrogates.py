"""The policy term of each ``loss_type``, per token, before averaging (TRL's ``GRPOTrainer`` names
and formulas):

- ``grpo``, ``dr_grpo``, ``dapo``: the clipped token ratio, ``-min(r A, clip(r, 1 - eps,
  1 + eps_high) A)`` with ``r = exp(logprobs - old)`` per token (they differ only in how
  :func:`trainer.algo.grpo.grpo_loss` averages);
- ``gspo`` (Group Sequence Policy Optimization, Qwen; TRL: ``loss_type="grpo"`` with
  ``importance_sampling_level="sequence"``): one ratio per sequence, ``s = exp(mean over the
  sequence's masked tokens of (logprobs - old))``, the geometric mean of its token ratios, clipped
  as above, ``-min(s A, clip(s) A)`` on each of its tokens, averaged as ``grpo``. A sequence is a
  training sequence (a rollout's merged calls, or one call where they did not merge);
- ``cispo`` (MiniMax-M1's clipped importance-sampling policy optimisation): the token ratio capped
  at ``eps_high`` (an absolute cap, not 1 + eps_high: TRL's ``epsilon_high``, ScaleRL's
  eps_max, 5.0 there) with its gradient stopped, times the advantage and the token's logprob,
  ``-sg(min(r, eps_high)) A logprob``: every token keeps a gradient (no token is clipped out, only
  its weight capped), averaged as ``dapo`` (over the batch's tokens).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

LossType = Literal["grpo", "dr_grpo", "dapo", "gspo", "cispo"]
LOSS_TYPES: tuple[str, ...] = typing.get_args(LossType)


@dataclass(frozen=True)
class PolicyTerm:
    """``per_token``: [B, T] the policy loss of each token (to minimise); ``ratio``: [B, T] the
    importance ratio it is made of (with its gradient; gspo's one ratio per sequence repeated on its
    tokens), which also weighs a bias-corrected KL; ``clipped``: [B, T] bool, True where the clip
    (cispo: the cap) acted in the direction the advantage pushes. Meaningful where the mask is 1."""

    per_token: Tensor
    ratio: Tensor
    clipped: Tensor


def policy_term(
    loss_type: LossType,
    logprobs: Tensor,
    old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    epsilon: float,
    epsilon_high: float,
) -> PolicyTerm:
    """The policy term of ``loss_type`` for ``logprobs`` [B, T] (with grad) against the old policy
    ``old`` [B, T], ``advantages`` [B, 1], ``mask`` [B, T] (1 on sampled tokens), the clip range
    ``[1 - epsilon, 1 + epsilon_high]`` (cispo: the cap ``epsilon_high``)."""
    log_ratio = torch.where(mask > 0, logprobs - old, torch.zeros_like(logprobs))
    if loss_type == "cispo":
        ratio = torch.exp(log_ratio)
        weight = torch.clamp(ratio, max=epsilon_high).detach()
        # Off the mask the logprob may be anything (padding): keep it out of the product.
        scored = torch.where(mask > 0, logprobs, torch.zeros_like(logprobs))
        clipped = (ratio > epsilon_high) & (advantages > 0)
        return PolicyTerm(per_token=-weight * advantages * scored, ratio=ratio, clipped=clipped)
    if loss_type == "gspo":
        sequence = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
        log_ratio = sequence.expand_as(logprobs)
    ratio = torch.exp(log_ratio)
    bounded = torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon_high)
    per_token = -torch.min(ratio * advantages, bounded * advantages)
    # The clipped branch is taken (no gradient flows) when the ratio left the band in the direction
    # the advantage pushes it.
    clipped = ((ratio < 1.0 - epsilon) & (advantages < 0)) | ((ratio > 1.0 + epsilon_high) & (advantages > 0))
    return PolicyTerm(per_token=per_token, ratio=ratio, clipped=clipped)
