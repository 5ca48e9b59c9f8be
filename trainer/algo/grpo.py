"""GRPO math as pure functions of tensors: advantages, token logprobs, entropy, the clipped loss
(each ``loss_type``'s policy term in :mod:`trainer.algo.surrogates`, the sampler-to-learner weights
in :mod:`trainer.algo.importance`).

Shapes: B sequences, T tokens (right-padded), V vocabulary. Every per-token tensor is aligned with
``input_ids``: column ``t`` is about token ``t`` (the logits at position ``t - 1`` predicted it), and
column 0 is 0 because nothing predicts the first token. A loss mask marks the sampled completion
tokens; everything else (prompts, environment turns, padding) is 0 and changes nothing.

Names and semantics follow TRL's ``GRPOTrainer`` (``loss_type``, ``epsilon``, ``epsilon_high``,
``beta``, the ``vllm_importance_sampling_*`` modes, ``use_bias_correction_kl``). Two old policies are
possible for the clipped ratio:

- without an importance-sampling mode (rftkit's default), the *sampler* that produced the tokens
  (the logprobs the policy server recorded), so the clipped ratio also absorbs any numeric mismatch
  between the inference engine and the trainer;
- with one (TRL's default), the learner's own logprobs of the batch before its first optimizer pass
  (``old_logprobs``, fixed for every pass), and each token's loss is weighted by the
  sampler-to-learner ratio ``exp(old_logprobs - behavior_logprobs)``, truncated or masked above a cap
  (:func:`trainer.algo.importance.sampler_importance_weights`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from trainer.algo.importance import ImportanceSamplingMode, ImportanceWeights, sampler_importance_weights
from trainer.algo.surrogates import LOSS_TYPES, LossType, policy_term


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


def _importance_metrics(weights: ImportanceWeights, mask: Tensor) -> dict[str, float]:
    on = mask > 0
    return {
        "is_ratio_mean": _masked_mean(weights.ratio, mask),
        "is_ratio_max": float(weights.ratio[on].max()) if bool(on.any()) else 1.0,
        "is_capped_fraction": _masked_mean(weights.capped.to(mask.dtype), mask),
        "is_weight_mean": _masked_mean(weights.weight, mask),
    }


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
    use_bias_correction_kl: bool = False,
    importance_sampling_mode: ImportanceSamplingMode | None = None,
    importance_sampling_cap: float = 3.0,
    old_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    episode_tokens: Tensor | None = None,
    total_episodes: int | None = None,
    total_tokens: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The clipped GRPO surrogate (to minimise) and its metrics: the policy term of ``loss_type``
    (:mod:`trainer.algo.surrogates`), weighted by the sampler-to-learner correction when one is on,
    plus the KL term, averaged.

    Args:
        logprobs: [B, T] current policy's token logprobs (with grad), from :func:`token_logprobs`.
        behavior_logprobs: [B, T] logprobs the sampler recorded for the same tokens (0 where masked).
        advantages: [B] one advantage per sequence, broadcast over its tokens, or [B, T] one per token
            (on-policy distillation's, :func:`trainer.algo.distill.distillation_advantages`).
        loss_mask: [B, T] 1 on sampled completion tokens, 0 elsewhere.
        loss_type: how per-token losses are averaged (an episode is one rollout: its calls make one
            merged sequence or several, see ``episode_tokens``):
            ``grpo``: mean over each episode's masked tokens, then mean over episodes;
            ``dr_grpo``: sum over all masked tokens / (episodes * ``max_completion_length``), Dr. GRPO's
            constant normaliser (no length bias);
            ``dapo``: sum over all masked tokens / number of masked tokens (token-level mean);
            ``gspo``: one clipped ratio per sequence (the exp of its tokens' mean log-ratio), averaged
            as ``grpo``; ``cispo``: each token's ratio capped at ``epsilon_high``, gradient stopped,
            times the advantage and the logprob, averaged as ``dapo``.
        epsilon, epsilon_high: the ratio is clipped to [1 - epsilon, 1 + epsilon_high]
            (``epsilon_high`` defaults to ``epsilon``; DAPO's clip-higher sets it larger); for
            ``cispo``, ``epsilon_high`` is the cap of the ratio itself, and required.
        max_completion_length: the constant of ``dr_grpo`` (required there, unused otherwise).
        ref_logprobs: [B, T] reference (base model) logprobs; with ``beta > 0`` adds ``beta * k3`` per
            token, k3 = exp(ref - lp) - (ref - lp) - 1, averaged like the surrogate.
        use_bias_correction_kl: multiply each token's k3 term by the importance ratio of the clipped
            objective (current over old policy, with its gradient), as TRL's option of the same name
            (DeepSeek-V3.2): the k3 estimate is then unbiased for samples from the old policy.
        importance_sampling_mode: None (default): the old policy of the clipped ratio is the sampler
            (``behavior_logprobs``). Else one of TRL's ``vllm_importance_sampling_mode`` values: the old
            policy is ``old_logprobs`` and each token's policy loss is weighted by
            :func:`sampler_importance_weights` of ``old_logprobs`` over ``behavior_logprobs``.
        importance_sampling_cap: the cap C of that mode (TRL's ``vllm_importance_sampling_cap``).
        old_logprobs: [B, T] the learner's logprobs of the batch before its first optimizer pass, no
            grad; used with an importance-sampling mode. Fixed across a batch's ``num_iterations``
            passes, so later passes are clipped against it. None: this is the batch's only pass and
            ``logprobs.detach()`` is the same value.
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
        branch was taken; cispo: whose weight was capped with a positive advantage, TRL's
        ``cispo_clip_ratio``), ``ratio_mean`` (of the clipped ratio; gspo: its sequences' ratios),
        ``mismatch_kl`` (k3 of KL(sampler || trainer), masked mean), when given ``kl`` and
        ``entropy``, and with an importance-sampling mode ``is_ratio_mean``, ``is_ratio_max`` (the
        sampler-to-learner ratio before its cap), ``is_capped_fraction`` (tokens whose ratio was
        truncated or masked) and ``is_weight_mean`` (the weight applied).
    """
    _check_loss_args(loss_type, max_completion_length, beta, ref_logprobs, epsilon_high)
    mask = loss_mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype)
    adv = adv if adv.dim() == 2 else adv.unsqueeze(-1)
    eps_low, eps_high = epsilon, epsilon if epsilon_high is None else epsilon_high

    # Where the mask is 0 the log-ratio is forced to 0, so padding with junk logprobs cannot make inf/nan.
    behavior_log_ratio = torch.where(mask > 0, logprobs - behavior_logprobs, torch.zeros_like(logprobs))
    metrics: dict[str, float] = {}
    old, weights = _old_policy(
        logprobs, behavior_logprobs, old_logprobs, mask, importance_sampling_mode, importance_sampling_cap
    )
    term = policy_term(loss_type, logprobs, old, adv, mask, eps_low, eps_high)
    per_token, ratio = term.per_token, term.ratio
    if weights is not None:
        per_token = per_token * weights.weight
        metrics.update(_importance_metrics(weights, mask))
    if ref_logprobs is not None:
        per_token = _with_kl(
            per_token, logprobs, ref_logprobs, ratio, mask, beta, use_bias_correction_kl, metrics
        )

    num_episodes = total_episodes or logprobs.shape[0]
    loss = _average(
        per_token * mask, mask, loss_type, num_episodes, episode_tokens, max_completion_length, total_tokens
    )

    metrics["clip_fraction"] = _masked_mean(term.clipped.to(mask.dtype), mask)
    metrics["ratio_mean"] = _masked_mean(ratio.detach(), mask)
    metrics["mismatch_kl"] = _masked_mean(_k3(behavior_log_ratio.detach()), mask)
    if entropy is not None:
        metrics["entropy"] = _masked_mean(entropy.detach(), mask)
    return loss, metrics


def _old_policy(
    logprobs: Tensor,
    behavior_logprobs: Tensor,
    old_logprobs: Tensor | None,
    mask: Tensor,
    mode: ImportanceSamplingMode | None,
    cap: float,
) -> tuple[Tensor, ImportanceWeights | None]:
    """The old policy of the clipped ratio (the sampler's logprobs without an importance-sampling
    mode), and with one the sampler-to-learner weights."""
    if mode is None:
        return behavior_logprobs, None
    old = logprobs.detach() if old_logprobs is None else old_logprobs.to(logprobs.dtype)
    return old, sampler_importance_weights(old, behavior_logprobs, mask, mode=mode, cap=cap)


def _with_kl(
    per_token: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    ratio: Tensor,
    mask: Tensor,
    beta: float,
    use_bias_correction_kl: bool,
    metrics: dict[str, float],
) -> Tensor:
    """``per_token`` plus ``beta * k3`` against the reference (reported as ``kl`` either way)."""
    kl = _k3(torch.where(mask > 0, ref_logprobs - logprobs, torch.zeros_like(logprobs)))
    if use_bias_correction_kl:
        kl = kl * ratio
    metrics["kl"] = _masked_mean(kl.detach(), mask)
    if beta > 0.0:
        per_token = per_token + beta * kl
    return per_token


def _check_loss_args(
    loss_type: str,
    max_completion_length: int | None,
    beta: float,
    ref_logprobs: Tensor | None,
    epsilon_high: float | None,
) -> None:
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {', '.join(LOSS_TYPES)}, got {loss_type!r}")
    if loss_type == "cispo" and epsilon_high is None:
        raise ValueError(
            "loss_type 'cispo' caps its importance weight at epsilon_high (ScaleRL uses 5.0): "
            "set epsilon_high"
        )
    if loss_type == "dr_grpo" and not max_completion_length:
        raise ValueError("loss_type 'dr_grpo' needs max_completion_length (its constant normaliser)")
    if beta > 0.0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs (the reference model's token logprobs)")


def _average(
    masked: Tensor,
    mask: Tensor,
    loss_type: LossType,
    num_episodes: int,
    episode_tokens: Tensor | None,
    max_completion_length: int | None,
    total_tokens: int | None,
) -> Tensor:
    """The masked per-token losses averaged as ``loss_type`` says (see :func:`grpo_loss`): gspo as
    grpo, cispo as dapo (TRL's normalisers for them)."""
    if loss_type in ("grpo", "gspo"):
        tokens = mask.sum(-1) if episode_tokens is None else episode_tokens.to(mask.dtype)
        return (masked.sum(-1) / tokens.clamp(min=1.0)).sum() / num_episodes
    if loss_type == "dr_grpo":
        assert max_completion_length is not None  # refused above when missing
        return masked.sum() / (num_episodes * max_completion_length)
    return masked.sum() / (total_tokens or mask.sum().clamp(min=1.0))
