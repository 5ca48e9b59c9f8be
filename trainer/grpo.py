"""GRPO math as pure functions of tensors: advantages, token logprobs, entropy, the clipped loss.

Shapes: B sequences, T tokens (right-padded), V vocabulary. Every per-token tensor is aligned with
``input_ids``: column ``t`` is about token ``t`` (the logits at position ``t - 1`` predicted it), and
column 0 is 0 because nothing predicts the first token. A loss mask marks the sampled completion
tokens; everything else (prompts, environment turns, padding) is 0 and changes nothing.

Names and semantics follow TRL's ``GRPOTrainer`` (``loss_type``, ``epsilon``, ``epsilon_high``,
``beta``), with one difference: the old policy of the importance ratio is the *sampler* that produced
the tokens (the logprobs the policy server recorded), so the ratio also absorbs any numeric mismatch
between the inference engine and the trainer.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

LossType = Literal["grpo", "dr_grpo", "dapo"]


def group_advantages(rewards: Tensor, scale_by_std: bool = True, eps: float = 1e-6) -> Tensor:
    """Advantages of one group of G rollouts of the same row: ``r - mean(r)``, optionally ``/ std(r)``.

    ``rewards`` has shape [G] (or [..., G] for several groups at once). The std is the sample std
    (Bessel-corrected, as TRL). A group whose rewards are all equal gets all-zero advantages: it
    carries no learning signal, whatever ``scale_by_std`` says.
    """
    centred = rewards - rewards.mean(dim=-1, keepdim=True)
    if not scale_by_std or rewards.shape[-1] < 2:
        return centred
    std = rewards.std(dim=-1, keepdim=True)
    # Equal rewards leave tiny float residues in `centred`; zero them rather than divide them by eps.
    return torch.where(std > eps, centred / (std + eps), torch.zeros_like(centred))


def _at_least_float32(logits: Tensor) -> Tensor:
    # bf16/fp16 log-softmax loses the small logprob differences the ratio is made of; float64 stays.
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def token_logprobs(logits: Tensor, input_ids: Tensor) -> Tensor:
    """Logprob of each token under the model, shape [B, T] from logits [B, T, V] and ids [B, T].

    ``result[:, t] = log_softmax(logits[:, t - 1])[input_ids[:, t]]`` for t >= 1; ``result[:, 0] = 0``.
    Logits are used raw (no temperature), matching the policy server's "raw" logprobs mode.
    """
    predicting = _at_least_float32(logits[:, :-1, :])
    targets = input_ids[:, 1:].unsqueeze(-1)
    # logit of the target minus logsumexp: the same value as gathering log_softmax, without keeping a
    # second [B, T, V] tensor alive for backward.
    picked = predicting.gather(-1, targets).squeeze(-1) - torch.logsumexp(predicting, dim=-1)
    return torch.nn.functional.pad(picked, (1, 0), value=0.0)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the predictive distribution for each token, [B, T], aligned like :func:`token_logprobs`.

    ``result[:, t]`` is the entropy of the distribution that predicted token ``t``; ``result[:, 0] = 0``.
    """
    predicting = _at_least_float32(logits[:, :-1, :])
    logp = torch.log_softmax(predicting, dim=-1)
    entropy = -(logp.exp() * logp).sum(dim=-1)
    return torch.nn.functional.pad(entropy, (1, 0), value=0.0)


def _k3(log_ratio: Tensor) -> Tensor:
    """Schulman's k3 estimate of KL(q || p), x ~ q, from ``log_ratio = log p(x) - log q(x)``; always >= 0."""
    return torch.exp(log_ratio) - log_ratio - 1.0


def _masked_mean(values: Tensor, mask: Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp(min=1.0))


def grpo_loss(
    logprobs: Tensor,
    behavior_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    loss_type: LossType = "grpo",
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    max_completion_length: int | None = None,
    ref_logprobs: Tensor | None = None,
    beta: float = 0.0,
    tis_cap: float | None = None,
    entropy: Tensor | None = None,
    episode_tokens: Tensor | None = None,
    total_episodes: int | None = None,
    total_tokens: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The clipped GRPO surrogate (to minimise) and its metrics.

    Args:
        logprobs: [B, T] current policy's token logprobs (with grad), from :func:`token_logprobs`.
        behavior_logprobs: [B, T] logprobs the sampler recorded for the same tokens (0 where masked).
        advantages: [B] one advantage per sequence, broadcast over its tokens.
        loss_mask: [B, T] 1 on sampled completion tokens, 0 elsewhere.
        loss_type: how per-token losses are averaged (an episode is one rollout: its calls make one
            merged sequence or several, see ``episode_tokens``):
            ``grpo``: mean over each episode's masked tokens, then mean over episodes;
            ``dr_grpo``: sum over all masked tokens / (episodes * ``max_completion_length``), Dr. GRPO's
            constant normaliser (no length bias);
            ``dapo``: sum over all masked tokens / number of masked tokens (token-level mean).
        epsilon, epsilon_high: the ratio is clipped to [1 - epsilon, 1 + epsilon_high]
            (``epsilon_high`` defaults to ``epsilon``; DAPO's clip-higher sets it larger).
        max_completion_length: the constant of ``dr_grpo`` (required there, unused otherwise).
        ref_logprobs: [B, T] reference (base model) logprobs; with ``beta > 0`` adds ``beta * k3`` per
            token, k3 = exp(ref - lp) - (ref - lp) - 1, averaged like the surrogate.
        tis_cap: truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly
            brings you off-policy RL training"; TRL's ``vllm_importance_sampling_cap``). The PPO ratio is
            then taken against the trainer's own logprobs before this update (``logprobs.detach()``,
            exact when a batch gets one optimizer step) and the sampler/trainer mismatch is corrected
            by the per-token weight ``min(exp(logprobs.detach() - behavior_logprobs), tis_cap)``.
        entropy: [B, T] optional per-token entropies, only reported (masked mean).
        episode_tokens: [B] masked tokens of each sequence's whole episode, counted over every
            sequence of that episode (in this batch or not). The episode, not the call, is the unit of
            the average: otherwise an episode split into k calls weighs k times, and since failed
            episodes tend to run longer, every token all calls share (the tool-call format) would be
            pushed down step after step. Default: each sequence is its own episode.
        total_episodes, total_tokens: the whole batch's episode count and masked-token count when
            this call sees one micro-batch of it; the micro-batch losses then sum to the full-batch
            loss, so gradient accumulation reproduces one big batch exactly. Default: this batch's.

    Returns:
        ``(loss, metrics)``: a scalar tensor and floats ``clip_fraction`` (masked tokens whose clipped
        branch was taken), ``ratio_mean``, ``mismatch_kl`` (k3 of KL(sampler || trainer), masked
        mean), and when given ``kl``, ``entropy``, ``tis_weight_mean``.
    """
    if loss_type not in ("grpo", "dr_grpo", "dapo"):
        raise ValueError(f"loss_type must be 'grpo', 'dr_grpo' or 'dapo', got {loss_type!r}")
    if loss_type == "dr_grpo" and not max_completion_length:
        raise ValueError("loss_type 'dr_grpo' needs max_completion_length (its constant normaliser)")
    if beta > 0.0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs (the reference model's token logprobs)")
    mask = loss_mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype).unsqueeze(-1)
    eps_low, eps_high = epsilon, epsilon if epsilon_high is None else epsilon_high

    # Where the mask is 0 the log-ratio is forced to 0, so padding with junk logprobs cannot make inf/nan.
    behavior_log_ratio = torch.where(mask > 0, logprobs - behavior_logprobs, torch.zeros_like(logprobs))
    old_logprobs = logprobs.detach() if tis_cap is not None else behavior_logprobs
    log_ratio = torch.where(mask > 0, logprobs - old_logprobs, torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = -torch.min(ratio * adv, clipped * adv)
    metrics: dict[str, float] = {}
    if tis_cap is not None:
        weight = torch.clamp(torch.exp(behavior_log_ratio.detach()), max=tis_cap)
        per_token = per_token * weight
        metrics["tis_weight_mean"] = _masked_mean(weight, mask)
    if ref_logprobs is not None:
        kl = _k3(torch.where(mask > 0, ref_logprobs - logprobs, torch.zeros_like(logprobs)))
        metrics["kl"] = _masked_mean(kl.detach(), mask)
        if beta > 0.0:
            per_token = per_token + beta * kl

    num_episodes = total_episodes or logprobs.shape[0]
    masked = per_token * mask
    if loss_type == "grpo":
        tokens = mask.sum(-1) if episode_tokens is None else episode_tokens.to(mask.dtype)
        loss = (masked.sum(-1) / tokens.clamp(min=1.0)).sum() / num_episodes
    elif loss_type == "dr_grpo":
        assert max_completion_length is not None  # refused above when missing
        loss = masked.sum() / (num_episodes * max_completion_length)
    else:
        loss = masked.sum() / (total_tokens or mask.sum().clamp(min=1.0))

    # The clipped branch is taken (no gradient flows) when the ratio left the band in the direction
    # the advantage pushes it.
    is_clipped = ((ratio < 1.0 - eps_low) & (adv < 0)) | ((ratio > 1.0 + eps_high) & (adv > 0))
    metrics["clip_fraction"] = _masked_mean(is_clipped.to(mask.dtype), mask)
    metrics["ratio_mean"] = _masked_mean(ratio.detach(), mask)
    metrics["mismatch_kl"] = _masked_mean(_k3(behavior_log_ratio.detach()), mask)
    if entropy is not None:
        metrics["entropy"] = _masked_mean(entropy.detach(), mask)
    return loss, metrics
