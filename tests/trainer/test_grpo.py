"""GRPO math against values worked out by hand, plus an autograd check through a tiny model."""

from __future__ import annotations

import math
import typing

import pytest
import torch

from trainer.algo.grpo import entropy_from_logits, group_advantages, grpo_loss, token_logprobs
from trainer.algo.importance import IMPORTANCE_SAMPLING_MODES, sampler_importance_weights
from trainer.config import ImportanceSamplingMode as ConfigMode

# The batch most tests use: 2 sequences, 5 columns, epsilon 0.2 (ratio band [0.8, 1.2]).
#   sequence 0: advantage +1,   loss mask [0, 1, 1, 1, 0], ratios on the masked tokens 1.0, 1.5, 0.7
#   sequence 1: advantage -0.5, loss mask [0, 1, 1, 0, 0], ratios on the masked tokens 0.5, 1.1
# Per-token loss is -min(r * A, clip(r, 0.8, 1.2) * A):
#   seq 0: r=1.0 -> -1.0;  r=1.5 -> -min(1.5, 1.2) = -1.2 (clipped);  r=0.7 -> -min(0.7, 0.8) = -0.7
#   seq 1: r=0.5 -> -min(-0.25, -0.4) = 0.4 (clipped);  r=1.1 -> -min(-0.55, -0.55) = 0.55
# Sums: seq 0 = -2.9 over 3 tokens, seq 1 = 0.95 over 2 tokens; 5 masked tokens, 2 clipped.
RATIOS = [[1.0, 1.0, 1.5, 0.7, 1.0], [1.0, 0.5, 1.1, 1.0, 1.0]]
MASK = [[0, 1, 1, 1, 0], [0, 1, 1, 0, 0]]
ADVANTAGES = [1.0, -0.5]


def make_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    behavior = torch.tensor(
        [[0.0, -0.5, -1.0, -2.0, -0.3], [0.0, -0.7, -0.2, -1.5, -3.0]], dtype=torch.float64
    )
    logprobs = (behavior + torch.tensor(RATIOS, dtype=torch.float64).log()).requires_grad_(True)
    return (
        logprobs,
        behavior,
        torch.tensor(ADVANTAGES, dtype=torch.float64),
        torch.tensor(MASK, dtype=torch.float64),
    )


def test_group_advantages_centre_and_scale_by_sample_std() -> None:
    rewards = torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=torch.float64)
    # mean 3 -> centred [-2, -1, 0, 3]; sample variance (4 + 1 + 0 + 9) / 3 = 14 / 3
    std = math.sqrt(14 / 3)
    expected = torch.tensor([-2 / std, -1 / std, 0.0, 3 / std], dtype=torch.float64)
    torch.testing.assert_close(group_advantages(rewards), expected, atol=1e-5, rtol=0)
    unscaled = group_advantages(rewards, scale_by_std=False)
    torch.testing.assert_close(unscaled, torch.tensor([-2.0, -1.0, 0.0, 3.0], dtype=torch.float64))


def test_group_advantages_zero_variance_group_is_all_zero() -> None:
    rewards = torch.tensor([[0.7, 0.7, 0.7], [1.0, 0.0, 0.5]])
    advantages = group_advantages(rewards)
    assert torch.equal(advantages[0], torch.zeros(3))
    # second group: mean 0.5, centred [0.5, -0.5, 0], sample std sqrt((0.25 + 0.25 + 0) / 2) = 0.5
    torch.testing.assert_close(advantages[1], torch.tensor([1.0, -1.0, 0.0]), atol=1e-5, rtol=0)
    assert torch.equal(group_advantages(rewards, scale_by_std=False)[0], torch.zeros(3))


def test_token_logprobs_and_entropy_by_hand() -> None:
    # Vocabulary of 3. Position 0 logits [0, 0, 0]: uniform. Position 1 logits [0, ln 2, 0]: [1/4, 1/2, 1/4].
    logits = torch.tensor([[[0.0, 0.0, 0.0], [0.0, math.log(2), 0.0], [5.0, -1.0, 2.0]]], dtype=torch.float64)
    input_ids = torch.tensor([[2, 1, 0]])
    # token 1 (id 1) was predicted by position 0: ln(1/3); token 2 (id 0) by position 1: ln(1/4).
    expected = torch.tensor([[0.0, math.log(1 / 3), math.log(1 / 4)]], dtype=torch.float64)
    torch.testing.assert_close(token_logprobs(logits, input_ids), expected)
    # entropies of the predicting distributions: ln 3, and 2 * (1/4) ln 4 + (1/2) ln 2 = 1.5 ln 2
    expected_entropy = torch.tensor([[0.0, math.log(3), 1.5 * math.log(2)]], dtype=torch.float64)
    torch.testing.assert_close(entropy_from_logits(logits), expected_entropy)


def test_token_logprobs_of_bfloat16_logits_are_computed_in_float32() -> None:
    logits = torch.randn(2, 4, 7, generator=torch.Generator().manual_seed(0))
    ids = torch.randint(0, 7, (2, 4), generator=torch.Generator().manual_seed(1))
    result = token_logprobs(logits.to(torch.bfloat16), ids)
    assert result.dtype == torch.float32
    torch.testing.assert_close(result, token_logprobs(logits.to(torch.bfloat16).float(), ids))


def test_grpo_loss_types_by_hand() -> None:
    logprobs, behavior, advantages, mask = make_batch()
    grpo, metrics = grpo_loss(logprobs, behavior, advantages, mask, loss_type="grpo")
    # mean per sequence (-2.9 / 3, 0.95 / 2), then over the 2 sequences
    assert grpo.item() == pytest.approx((-2.9 / 3 + 0.95 / 2) / 2)
    dr_grpo, _ = grpo_loss(logprobs, behavior, advantages, mask, loss_type="dr_grpo", max_completion_length=4)
    # (-2.9 + 0.95) / (2 sequences * 4)
    assert dr_grpo.item() == pytest.approx(-1.95 / 8)
    dapo, _ = grpo_loss(logprobs, behavior, advantages, mask, loss_type="dapo")
    # (-2.9 + 0.95) / 5 masked tokens
    assert dapo.item() == pytest.approx(-1.95 / 5)

    assert metrics["clip_fraction"] == pytest.approx(2 / 5)
    assert metrics["ratio_mean"] == pytest.approx((1.0 + 1.5 + 0.7 + 0.5 + 1.1) / 5)
    # k3 = r - 1 - ln r summed over the 5 tokens: (4.8 - 5) - ln(1.0 * 1.5 * 0.7 * 0.5 * 1.1)
    assert metrics["mismatch_kl"] == pytest.approx((-0.2 - math.log(0.5775)) / 5)
    assert "kl" not in metrics and "entropy" not in metrics


def test_grpo_averages_per_episode_so_splitting_calls_changes_nothing() -> None:
    # The batch's two sequences as two calls of one episode (same advantage +1 for both): the grpo
    # loss is the episode's token mean, as if the calls were one merged sequence, not the mean of
    # the two per-call means.
    logprobs, behavior, _, mask = make_batch()
    advantages = torch.tensor([1.0, 1.0], dtype=torch.float64)
    # per-token losses: seq 0 as before (-1.0, -1.2, -0.7); seq 1 with A = +1: r=0.5 -> -0.5,
    # r=1.1 -> -1.1. One episode of 5 tokens: (-2.9 - 1.6) / 5.
    episode = torch.tensor([5, 5])
    split, _ = grpo_loss(
        logprobs, behavior, advantages, mask, loss_type="grpo", episode_tokens=episode, total_episodes=1
    )
    assert split.item() == pytest.approx(-4.5 / 5)
    merged_lp = torch.cat([logprobs[0, :4], logprobs[1, 1:3]]).unsqueeze(0)
    merged_behavior = torch.cat([behavior[0, :4], behavior[1, 1:3]]).unsqueeze(0)
    merged_mask = torch.tensor([[0, 1, 1, 1, 1, 1]], dtype=torch.float64)
    merged, _ = grpo_loss(merged_lp, merged_behavior, advantages[:1], merged_mask, loss_type="grpo")
    assert merged.item() == pytest.approx(split.item())
    # Without episodes each call counts as one: (-2.9 / 3 - 1.6 / 2) / 2.
    per_call, _ = grpo_loss(logprobs, behavior, advantages, mask, loss_type="grpo")
    assert per_call.item() == pytest.approx((-2.9 / 3 - 1.6 / 2) / 2)
    dr_grpo, _ = grpo_loss(
        logprobs, behavior, advantages, mask, loss_type="dr_grpo", max_completion_length=4, total_episodes=1
    )
    assert dr_grpo.item() == pytest.approx(-4.5 / 4)


def test_clipped_tokens_give_no_gradient_and_unclipped_ones_do() -> None:
    logprobs, behavior, advantages, mask = make_batch()
    loss, _ = grpo_loss(logprobs, behavior, advantages, mask, loss_type="dapo")
    loss.backward()
    grad = logprobs.grad
    # d(-r A)/d lp = -r A, divided by the 5 masked tokens
    assert grad[0, 1].item() == pytest.approx(-1.0 * 1.0 / 5)  # r = 1.0, A = +1: inside the band
    assert grad[0, 2].item() == 0.0  # r = 1.5 > 1.2 with A > 0: clipped
    assert grad[0, 3].item() == pytest.approx(-0.7 * 1.0 / 5)  # r = 0.7 < 0.8 with A > 0: still pushed up
    assert grad[1, 1].item() == 0.0  # r = 0.5 < 0.8 with A < 0: clipped
    assert grad[1, 2].item() == pytest.approx(-1.1 * -0.5 / 5)  # r = 1.1, A < 0: inside the band
    # a ratio beyond 1 + eps with a negative advantage is not clipped: the loss keeps pulling it down
    lp = torch.tensor([[0.0, math.log(1.5)]], dtype=torch.float64, requires_grad=True)
    loss, metrics = grpo_loss(
        lp, torch.zeros(1, 2, dtype=torch.float64), torch.tensor([-1.0]), torch.tensor([[0, 1]])
    )
    loss.backward()
    assert loss.item() == pytest.approx(1.5)  # -min(-1.5, -1.2)
    assert lp.grad[0, 1].item() == pytest.approx(1.5)
    assert metrics["clip_fraction"] == 0.0


def test_epsilon_high_widens_the_upper_bound_only() -> None:
    logprobs, behavior, advantages, mask = make_batch()
    loss, metrics = grpo_loss(logprobs, behavior, advantages, mask, loss_type="dapo", epsilon_high=0.6)
    # r = 1.5 is now inside [0.8, 1.6]: seq 0 sums to -(1.0 + 1.5 + 0.7) = -3.2; seq 1 is unchanged (0.95)
    assert loss.item() == pytest.approx((-3.2 + 0.95) / 5)
    assert metrics["clip_fraction"] == pytest.approx(1 / 5)


def test_masked_tokens_change_nothing() -> None:
    logprobs, behavior, advantages, mask = make_batch()
    ref = logprobs.detach() - 0.3
    wild_lp = logprobs.detach().clone()
    wild_behavior = behavior.clone()
    wild_ref = ref.clone()
    off = mask == 0
    wild_lp[off] = 40.0
    wild_behavior[off] = -math.inf
    wild_ref[off] = 1e4
    wild_lp.requires_grad_(True)
    old = logprobs.detach() - 0.1
    wild_old = old.clone()
    wild_old[off] = -1e4
    for loss_type, mode in (("grpo", None), ("dr_grpo", "sequence_truncate"), ("dapo", "token_mask")):
        kwargs = {"loss_type": loss_type, "max_completion_length": 4, "ref_logprobs": ref, "beta": 0.1}
        if mode is not None:
            kwargs.update(importance_sampling_mode=mode, old_logprobs=old, use_bias_correction_kl=True)
        clean, clean_metrics = grpo_loss(logprobs, behavior, advantages, mask, **kwargs)
        kwargs["ref_logprobs"] = wild_ref
        if mode is not None:
            kwargs["old_logprobs"] = wild_old
        wild, wild_metrics = grpo_loss(wild_lp, wild_behavior, advantages, mask, **kwargs)
        (clean_grad,) = torch.autograd.grad(clean, logprobs)
        (wild_grad,) = torch.autograd.grad(wild, wild_lp)
        assert wild.item() == pytest.approx(clean.item())
        assert wild_metrics == pytest.approx(clean_metrics)
        torch.testing.assert_close(wild_grad, clean_grad)
        assert torch.all(wild_grad[off] == 0)


def test_kl_term_to_the_reference() -> None:
    logprobs, behavior, advantages, mask = make_batch()
    # ref - lp = ln 2 on every token: k3 = 2 - ln 2 - 1
    ref = logprobs.detach() + math.log(2)
    k3 = 1 - math.log(2)
    base, _ = grpo_loss(logprobs, behavior, advantages, mask, loss_type="grpo")
    with_kl, metrics = grpo_loss(
        logprobs, behavior, advantages, mask, loss_type="grpo", ref_logprobs=ref, beta=0.1
    )
    # every token gains 0.1 * k3, so each per-sequence mean and their mean gain it too
    assert with_kl.item() == pytest.approx(base.item() + 0.1 * k3)
    assert metrics["kl"] == pytest.approx(k3)
    dr, _ = grpo_loss(
        logprobs,
        behavior,
        advantages,
        mask,
        loss_type="dr_grpo",
        max_completion_length=4,
        ref_logprobs=ref,
        beta=0.1,
    )
    dr_base, _ = grpo_loss(logprobs, behavior, advantages, mask, loss_type="dr_grpo", max_completion_length=4)
    # averaged like the loss: 5 tokens * 0.1 * k3 / (2 * 4)
    assert dr.item() == pytest.approx(dr_base.item() + 5 * 0.1 * k3 / 8)
    # beta 0 with a reference: reported, not trained
    reported, metrics = grpo_loss(logprobs, behavior, advantages, mask, ref_logprobs=ref)
    assert reported.item() == pytest.approx(base.item())
    assert metrics["kl"] == pytest.approx(k3)


def test_truncated_importance_weights_on_a_single_pass() -> None:
    logprobs, behavior, advantages, mask = make_batch()
    loss, metrics = grpo_loss(
        logprobs,
        behavior,
        advantages,
        mask,
        loss_type="dapo",
        importance_sampling_mode="token_truncate",
        importance_sampling_cap=1.3,
    )
    # No old_logprobs: the batch's only pass, so the PPO ratio is against this pass's own (detached)
    # logprobs, i.e. 1, and per-token loss = -A * w, w = min(exp(lp - behavior), 1.3):
    # seq 0 w = [1.0, 1.3, 0.7] -> -3.0; seq 1 w = [0.5, 1.1] -> 0.5 * (0.5 + 1.1) = 0.8
    assert loss.item() == pytest.approx((-3.0 + 0.8) / 5)
    assert metrics["is_weight_mean"] == pytest.approx((1.0 + 1.3 + 0.7 + 0.5 + 1.1) / 5)
    assert metrics["is_ratio_mean"] == pytest.approx((1.0 + 1.5 + 0.7 + 0.5 + 1.1) / 5)
    assert metrics["is_ratio_max"] == pytest.approx(1.5)
    assert metrics["is_capped_fraction"] == pytest.approx(1 / 5)
    assert metrics["clip_fraction"] == 0.0
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert grad[0, 2].item() == pytest.approx(-1.0 * 1.3 / 5)
    assert grad[1, 1].item() == pytest.approx(0.5 * 0.5 / 5)


def test_second_pass_is_clipped_against_the_old_policy_fixed_before_the_first() -> None:
    # One sequence, A = +1, two trained tokens; the sampler agrees with the learner (weights 1).
    old = torch.tensor([[0.0, -1.0, -2.0]], dtype=torch.float64)
    mask = torch.tensor([[0, 1, 1]], dtype=torch.float64)
    advantages = torch.tensor([1.0], dtype=torch.float64)
    options = {"loss_type": "dapo", "importance_sampling_mode": "token_truncate", "old_logprobs": old}
    # Pass 1: the learner is still the old policy: ratios 1, loss -1 per token, nothing clipped.
    first = old.clone().requires_grad_(True)
    loss, metrics = grpo_loss(first, old, advantages, mask, **options)
    assert loss.item() == pytest.approx(-1.0)
    assert metrics["clip_fraction"] == 0.0
    # Pass 2: the first update moved the tokens' ratios to 1.5 and 1.1 against the fixed old policy.
    # 1.5 > 1.2 with A > 0 is clipped: loss -1.2, no gradient; 1.1 is inside: loss -1.1, gradient
    # -1.1 / 2 tokens.
    second = (old + torch.tensor([[0.0, math.log(1.5), math.log(1.1)]], dtype=torch.float64)).requires_grad_()
    loss, metrics = grpo_loss(second, old, advantages, mask, **options)
    assert loss.item() == pytest.approx((-1.2 - 1.1) / 2)
    assert metrics["clip_fraction"] == pytest.approx(1 / 2)
    assert metrics["ratio_mean"] == pytest.approx((1.5 + 1.1) / 2)
    (grad,) = torch.autograd.grad(loss, second)
    assert grad[0, 1].item() == 0.0
    assert grad[0, 2].item() == pytest.approx(-1.1 / 2)
    # The weights stay those of the old policy over the sampler (1 here), not of the moved learner.
    assert metrics["is_weight_mean"] == 1.0
    # Against its own detached logprobs (the old behaviour) the second pass would never be clipped.
    own = second.detach().clone().requires_grad_(True)
    options["old_logprobs"] = None
    _, metrics = grpo_loss(own, old, advantages, mask, **options)
    assert metrics["clip_fraction"] == 0.0 and metrics["ratio_mean"] == 1.0


# Old-policy over sampler log-ratios on the masked tokens (batch of make_batch's mask):
#   sequence 0: ratios 2, 2, 0.5 (product 2);   sequence 1: ratios 4, 1.5 (product 6).   Cap 3.
SAMPLER_RATIOS = [[1.0, 2.0, 2.0, 0.5, 1.0], [1.0, 4.0, 1.5, 1.0, 1.0]]
MODE_WEIGHTS = {
    "token_truncate": ([2.0, 2.0, 0.5], [3.0, 1.5], 1 / 5),
    "token_mask": ([2.0, 2.0, 0.5], [0.0, 1.5], 1 / 5),
    "sequence_truncate": ([2.0, 2.0, 2.0], [3.0, 3.0], 2 / 5),
    "sequence_mask": ([2.0, 2.0, 2.0], [0.0, 0.0], 2 / 5),
}


@pytest.mark.parametrize("mode", list(MODE_WEIGHTS))
def test_importance_sampling_modes_by_hand(mode: str) -> None:
    _, behavior, advantages, mask = make_batch()
    old = behavior + torch.tensor(SAMPLER_RATIOS, dtype=torch.float64).log()
    old[mask == 0] = 7.0  # junk off the mask changes nothing
    weights = sampler_importance_weights(old, behavior, mask, mode=mode, cap=3.0)
    first_row, second_row, capped = MODE_WEIGHTS[mode]
    torch.testing.assert_close(weights.weight[0, 1:4], torch.tensor(first_row, dtype=torch.float64))
    torch.testing.assert_close(weights.weight[1, 1:3], torch.tensor(second_row, dtype=torch.float64))
    # First pass (learner == old policy): ratio 1, per-token loss -A * w; dapo over 5 tokens.
    loss, metrics = grpo_loss(
        old.clone().requires_grad_(True),
        behavior,
        advantages,
        mask,
        loss_type="dapo",
        importance_sampling_mode=mode,
        importance_sampling_cap=3.0,
        old_logprobs=old,
    )
    assert loss.item() == pytest.approx((-sum(first_row) + 0.5 * sum(second_row)) / 5)
    assert metrics["is_capped_fraction"] == pytest.approx(capped)
    if mode.startswith("token"):
        assert metrics["is_ratio_mean"] == pytest.approx((2 + 2 + 0.5 + 4 + 1.5) / 5)
        assert metrics["is_ratio_max"] == pytest.approx(4.0)
    else:
        assert metrics["is_ratio_mean"] == pytest.approx((3 * 2 + 2 * 6) / 5)
        assert metrics["is_ratio_max"] == pytest.approx(6.0)


def test_importance_sampling_modes_match_the_config_choices() -> None:
    assert set(IMPORTANCE_SAMPLING_MODES) == set(typing.get_args(ConfigMode))
    logprobs, behavior, _, mask = make_batch()
    with pytest.raises(ValueError, match="mode"):
        sampler_importance_weights(logprobs, behavior, mask, mode="token")  # type: ignore[arg-type]


def test_bias_corrected_kl_is_k3_times_the_clipped_ratio() -> None:
    # One sequence, A = 0 (only the KL term is left), beta 0.1, ref - lp = ln 2 on both trained
    # tokens: k3 = 2 - ln 2 - 1 = 1 - ln 2. Old policy: the sampler, with ratios 1.5 and 0.9.
    behavior = torch.tensor([[0.0, -1.0, -2.0]], dtype=torch.float64)
    logprobs = (
        behavior + torch.tensor([[0.0, math.log(1.5), math.log(0.9)]], dtype=torch.float64)
    ).requires_grad_()
    ref = logprobs.detach() + math.log(2)
    mask = torch.tensor([[0, 1, 1]], dtype=torch.float64)
    k3 = 1 - math.log(2)
    options = {"loss_type": "dapo", "ref_logprobs": ref, "beta": 0.1}
    zero = torch.tensor([0.0], dtype=torch.float64)
    plain, metrics = grpo_loss(logprobs, behavior, zero, mask, **options)
    assert metrics["kl"] == pytest.approx(k3)
    corrected, corrected_metrics = grpo_loss(
        logprobs, behavior, zero, mask, use_bias_correction_kl=True, **options
    )
    # k3 * ratio per token: mean k3 * (1.5 + 0.9) / 2
    assert corrected_metrics["kl"] == pytest.approx(k3 * 1.2)
    assert corrected.item() == pytest.approx(0.1 * k3 * 1.2)
    assert plain.item() == pytest.approx(0.1 * k3)
    # d k3 / d lp = -(e^(ref - lp) - 1) = -1; d ratio / d lp = ratio. So d(k3 * r)/d lp = r (k3 - 1).
    (grad,) = torch.autograd.grad(corrected, logprobs)
    assert grad[0, 1].item() == pytest.approx(0.1 * 1.5 * (k3 - 1) / 2)
    assert grad[0, 2].item() == pytest.approx(0.1 * 0.9 * (k3 - 1) / 2)
    (plain_grad,) = torch.autograd.grad(plain, logprobs)
    assert plain_grad[0, 1].item() == pytest.approx(0.1 * -1 / 2)


def test_entropy_is_reported_as_a_masked_mean() -> None:
    logprobs, behavior, advantages, mask = make_batch()
    entropy = torch.arange(10, dtype=torch.float64).reshape(2, 5)
    _, metrics = grpo_loss(logprobs, behavior, advantages, mask, entropy=entropy)
    # masked entries: 1, 2, 3 and 6, 7
    assert metrics["entropy"] == pytest.approx((1 + 2 + 3 + 6 + 7) / 5)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_micro_batch_losses_sum_to_the_full_batch_loss(loss_type: str) -> None:
    logprobs, behavior, advantages, mask = make_batch()
    kwargs = {"loss_type": loss_type, "max_completion_length": 4}
    full, _ = grpo_loss(logprobs, behavior, advantages, mask, **kwargs)
    parts = [
        grpo_loss(
            logprobs[i : i + 1],
            behavior[i : i + 1],
            advantages[i : i + 1],
            mask[i : i + 1],
            total_episodes=2,
            total_tokens=5,
            **kwargs,
        )[0]
        for i in range(2)
    ]
    assert sum(part.item() for part in parts) == pytest.approx(full.item())


def test_bad_arguments_are_named() -> None:
    logprobs, behavior, advantages, mask = make_batch()
    with pytest.raises(ValueError, match="loss_type"):
        grpo_loss(logprobs, behavior, advantages, mask, loss_type="ppo")
    with pytest.raises(ValueError, match="max_completion_length"):
        grpo_loss(logprobs, behavior, advantages, mask, loss_type="dr_grpo")
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(logprobs, behavior, advantages, mask, beta=0.04)


def tiny_model_problem() -> tuple:
    """A tiny causal model (embedding, running sum, linear head) in float64 and a batch to train on."""
    torch.manual_seed(0)
    vocab, hidden = 7, 3
    embedding = torch.randn(vocab, hidden, dtype=torch.float64)
    input_ids = torch.tensor([[1, 4, 2, 6, 0, 3], [5, 2, 2, 1, 0, 0]])
    weight0 = torch.randn(vocab, hidden, dtype=torch.float64)

    def logprobs_of(weight: torch.Tensor) -> torch.Tensor:
        hidden_states = torch.cumsum(embedding[input_ids], dim=1)  # causal: position t sees tokens <= t
        return token_logprobs(hidden_states @ weight.T, input_ids)

    start = logprobs_of(weight0).detach()
    # behavior ratios 1.0, 1.5, 0.6, 0.95: every token well away from the clip boundaries 0.8 and 1.2
    up, down, near = -math.log(1.5), -math.log(0.6), -math.log(0.95)
    offsets = torch.tensor(
        [[0.0, 0.0, 0.0, up, down, near], [0.0, up, near, down, 0.0, 0.0]], dtype=torch.float64
    )
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0]], dtype=torch.float64)
    advantages = torch.tensor([0.8, -1.2], dtype=torch.float64)
    return weight0, logprobs_of, start, start + offsets, mask, advantages


def central_differences(function, point: torch.Tensor, step: float = 1e-6) -> torch.Tensor:
    gradient = torch.zeros_like(point)
    for index in range(point.numel()):
        delta = torch.zeros_like(point).view(-1)
        delta[index] = step
        delta = delta.view_as(point)
        gradient.view(-1)[index] = (function(point + delta) - function(point - delta)).item() / (2 * step)
    return gradient


@pytest.mark.parametrize(
    "options",
    [
        {"loss_type": "grpo"},
        {"loss_type": "dr_grpo", "max_completion_length": 6},
        {"loss_type": "dapo", "beta": 0.05},
    ],
)
def test_gradient_through_a_tiny_model_matches_finite_differences(options: dict) -> None:
    weight0, logprobs_of, start, behavior, mask, advantages = tiny_model_problem()

    def loss_of(weight: torch.Tensor) -> torch.Tensor:
        loss, _ = grpo_loss(
            logprobs_of(weight), behavior, advantages, mask, ref_logprobs=start - 0.2, **options
        )
        return loss

    weight = weight0.clone().requires_grad_(True)
    (analytic,) = torch.autograd.grad(loss_of(weight), weight)
    torch.testing.assert_close(analytic, central_differences(loss_of, weight0), atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("fixed_old", [False, True], ids=["own-detached", "old-logprobs"])
def test_truncated_importance_gradient_is_the_weighted_policy_gradient(fixed_old: bool) -> None:
    # With an importance-sampling mode the loss value is a surrogate (its ratio is against the old
    # policy `start`: given, or this pass's detached logprobs, the same value here); its gradient must
    # equal that of the weighted objective with the old policy frozen at `start`:
    #   mean over sequences of mean over tokens of -A * min(exp(start - behavior), cap) * exp(lp - start)
    weight0, logprobs_of, start, behavior, mask, advantages = tiny_model_problem()
    weights = torch.clamp(torch.exp(start - behavior), max=1.3)

    def frozen_objective(weight: torch.Tensor) -> torch.Tensor:
        per_token = -advantages.unsqueeze(-1) * weights * torch.exp(logprobs_of(weight) - start) * mask
        return (per_token.sum(-1) / mask.sum(-1)).mean()

    weight = weight0.clone().requires_grad_(True)
    loss, _ = grpo_loss(
        logprobs_of(weight),
        behavior,
        advantages,
        mask,
        importance_sampling_mode="token_truncate",
        importance_sampling_cap=1.3,
        old_logprobs=start if fixed_old else None,
    )
    (analytic,) = torch.autograd.grad(loss, weight)
    torch.testing.assert_close(analytic, central_differences(frozen_objective, weight0), atol=1e-7, rtol=1e-5)
