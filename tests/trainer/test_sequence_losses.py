"""loss_type gspo and cispo (trainer/algo/surrogates.py) against values worked out by hand, with
TRL's formulas: GSPO's one clipped ratio per sequence, CISPO's capped stop-gradient weight."""

from __future__ import annotations

import math
import typing
from pathlib import Path

import pytest
import torch

from trainer.algo.grpo import grpo_loss
from trainer.algo.surrogates import LOSS_TYPES
from trainer.config import TrainConfig
from trainer.config.objective import LossType as ConfigLossType

# 2 sequences, 5 columns, as tests/trainer/test_grpo.py's batch:
#   sequence 0: advantage +1,   loss mask [0, 1, 1, 1, 0], token ratios 1.0, 1.5, 0.7 on the mask
#   sequence 1: advantage -0.5, loss mask [0, 1, 1, 0, 0], token ratios 0.5, 1.1
BEHAVIOR = [[0.0, -0.5, -1.0, -2.0, -0.3], [0.0, -0.7, -0.2, -1.5, -3.0]]
RATIOS = [[1.0, 1.0, 1.5, 0.7, 1.0], [1.0, 0.5, 1.1, 1.0, 1.0]]
MASK = [[0, 1, 1, 1, 0], [0, 1, 1, 0, 0]]
ADVANTAGES = [1.0, -0.5]


def make_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    behavior = torch.tensor(BEHAVIOR, dtype=torch.float64)
    logprobs = (behavior + torch.tensor(RATIOS, dtype=torch.float64).log()).requires_grad_(True)
    return logprobs, behavior, torch.tensor(ADVANTAGES, dtype=torch.float64), torch.tensor(MASK).double()


def test_gspo_clips_one_ratio_per_sequence_by_hand() -> None:
    logprobs, behavior, advantages, mask = make_batch()
    loss, metrics = grpo_loss(logprobs, behavior, advantages, mask, loss_type="gspo")
    loss.backward()

    # Sequence 0: s = exp(mean(ln 1.0, ln 1.5, ln 0.7)) = 1.05 ** (1/3) = 1.0164, inside [0.8, 1.2]:
    # -s * 1 on each token. Sequence 1: s = 0.55 ** (1/2) = 0.7416 < 0.8 with A = -0.5: clipped,
    # -min(0.7416 * -0.5, 0.8 * -0.5) = 0.4 on each token. Averaged as grpo: per sequence, then over both.
    s0, s1 = 1.05 ** (1 / 3), 0.55**0.5
    assert loss.item() == pytest.approx((-s0 + 0.4) / 2)
    # Every token of sequence 0 gets the same gradient, d(-s0 / 2)/d lp = -(s0 / 3) / 2, even the
    # one whose own ratio (1.5) grpo would clip; sequence 1 is clipped as a whole: none.
    grad = logprobs.grad
    assert grad[0, 1:4].tolist() == pytest.approx([-s0 / 6] * 3)
    assert grad[1].abs().sum().item() == 0.0
    assert grad[0, [0, 4]].abs().sum().item() == 0.0
    assert metrics["clip_fraction"] == pytest.approx(2 / 5)  # sequence 1's two tokens
    assert metrics["ratio_mean"] == pytest.approx((3 * s0 + 2 * s1) / 5)


def test_gspo_is_grpo_when_every_token_of_a_sequence_has_one_ratio() -> None:
    behavior = torch.tensor(BEHAVIOR, dtype=torch.float64)
    ratios = torch.tensor([[1.0, 1.1, 1.1, 1.1, 1.0], [1.0, 0.6, 0.6, 1.0, 1.0]], dtype=torch.float64)
    logprobs = behavior + ratios.log()
    advantages, mask = torch.tensor(ADVANTAGES, dtype=torch.float64), torch.tensor(MASK).double()
    gspo, _ = grpo_loss(logprobs, behavior, advantages, mask, loss_type="gspo")
    grpo, _ = grpo_loss(logprobs, behavior, advantages, mask, loss_type="grpo")
    # -1.1 on sequence 0; sequence 1 clipped at 0.8: -min(-0.3, -0.4) = 0.4.
    assert gspo.item() == pytest.approx(grpo.item()) and gspo.item() == pytest.approx((-1.1 + 0.4) / 2)


def test_cispo_caps_a_stop_gradient_weight_on_the_logprob_by_hand() -> None:
    logprobs, behavior, advantages, mask = make_batch()
    loss, metrics = grpo_loss(logprobs, behavior, advantages, mask, loss_type="cispo", epsilon_high=1.3)
    loss.backward()

    # Weights min(r, 1.3): 1.0, 1.3, 0.7 | 0.5, 1.1. Logprobs on the mask: -0.5, -1.0 + ln 1.5,
    # -2.0 + ln 0.7 | -0.7 + ln 0.5, -0.2 + ln 1.1. Per token -w * A * lp, summed over 5 tokens (dapo).
    sequence0 = -(1.0 * -0.5 + 1.3 * (-1.0 + math.log(1.5)) + 0.7 * (-2.0 + math.log(0.7)))
    sequence1 = 0.5 * (0.5 * (-0.7 + math.log(0.5)) + 1.1 * (-0.2 + math.log(1.1)))
    assert loss.item() == pytest.approx((sequence0 + sequence1) / 5)
    # d/d lp = -w * A / 5: every token keeps a gradient, the capped one (r = 1.5) with weight 1.3,
    # where grpo's clip gives it none; the weight itself passes none.
    assert logprobs.grad[0, 1:4].tolist() == pytest.approx([-1.0 / 5, -1.3 / 5, -0.7 / 5])
    assert logprobs.grad[1, 1:3].tolist() == pytest.approx([0.5 * 0.5 / 5, 1.1 * 0.5 / 5])
    # TRL's cispo_clip_ratio: ratio above the cap with a positive advantage (the 1.5).
    assert metrics["clip_fraction"] == pytest.approx(1 / 5)


def test_cispo_needs_its_cap_and_padding_junk_changes_nothing() -> None:
    logprobs, behavior, advantages, mask = make_batch()
    with pytest.raises(ValueError, match="set epsilon_high"):
        grpo_loss(logprobs, behavior, advantages, mask, loss_type="cispo")
    junk = logprobs.detach().clone()
    junk[mask == 0] = -math.inf
    clean, _ = grpo_loss(logprobs.detach(), behavior, advantages, mask, loss_type="cispo", epsilon_high=5.0)
    padded, _ = grpo_loss(junk, behavior, advantages, mask, loss_type="cispo", epsilon_high=5.0)
    assert padded.item() == clean.item()


@pytest.mark.parametrize("loss_type", ["gspo", "cispo"])
def test_micro_batch_losses_sum_to_the_full_batch_loss(loss_type: str) -> None:
    logprobs, behavior, advantages, mask = make_batch()
    kwargs = {"loss_type": loss_type, "epsilon_high": 1.3}
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


def test_gspo_gradient_through_the_sequence_mean_matches_finite_differences() -> None:
    generator = torch.Generator().manual_seed(0)
    weight0 = torch.randn(3, dtype=torch.float64, generator=generator)
    features = torch.randn(2, 5, 3, dtype=torch.float64, generator=generator)
    behavior = torch.tensor(BEHAVIOR, dtype=torch.float64)
    advantages, mask = torch.tensor([0.8, -1.2], dtype=torch.float64), torch.tensor(MASK).double()

    def loss_of(weight: torch.Tensor) -> torch.Tensor:
        # Logprobs near the sampler's (ratios within ~0.9-1.1 of it): inside the clip band.
        logprobs = behavior + 0.05 * torch.tanh(features @ weight)
        return grpo_loss(logprobs, behavior, advantages, mask, loss_type="gspo")[0]

    weight = weight0.clone().requires_grad_(True)
    (analytic,) = torch.autograd.grad(loss_of(weight), weight)
    step = 1e-6
    numeric = torch.stack(
        [
            (loss_of(weight0 + step * unit) - loss_of(weight0 - step * unit)) / (2 * step)
            for unit in torch.eye(3, dtype=torch.float64)
        ]
    )
    assert analytic.abs().sum() > 0
    torch.testing.assert_close(analytic, numeric, atol=1e-8, rtol=1e-6)


def test_the_config_offers_the_loss_types_the_math_computes() -> None:
    assert set(LOSS_TYPES) == set(typing.get_args(ConfigLossType))
    config = TrainConfig.model_validate({"loss_type": "cispo", "epsilon_high": 5.0})
    assert (config.loss_type, config.epsilon_high) == ("cispo", 5.0)
    gspo = TrainConfig.model_validate({"loss_type": "gspo", "epsilon": 3e-4, "epsilon_high": 4e-4})
    assert (gspo.loss_type, gspo.epsilon, gspo.epsilon_high) == ("gspo", 3e-4, 4e-4)


@pytest.mark.parametrize("loss_type", ["gspo", "cispo"])
def test_the_learner_takes_a_step_with_each(tiny_model_dir: Path, loss_type: str) -> None:
    from trainer.algo.sequences import TrainingSequence
    from trainer.learner.learner import Learner

    config = TrainConfig.model_validate({"loss_type": loss_type, "epsilon_high": 5.0, "lora": {"r": 2}})
    learner = Learner(tiny_model_dir, config)
    ids = [[3, 9, 4, 7, 12, 5, 8], [6, 2, 11, 4, 9]]

    def sequences(logprobs: list[list[float]]) -> list[TrainingSequence]:
        return [
            TrainingSequence(
                rollout_id=f"r{i}",
                token_ids=row,
                loss_mask=[0, 0] + [1] * (len(row) - 2),
                behavior_logprobs=logprobs[i],
                advantage=advantage,
                num_calls=1,
            )
            for i, (row, advantage) in enumerate(zip(ids, [1.0, -1.0], strict=True))
        ]

    batch, _ = learner.batch_inputs(sequences([[0.0] * len(row) for row in ids]))
    with torch.no_grad():
        own, _ = learner.token_logprobs(batch)  # on-policy: the sampler's logprobs are the learner's
    on_policy = sequences([own[i, : len(row)].tolist() for i, row in enumerate(ids)])
    before = {name: p.detach().clone() for name, p in learner.model.named_parameters() if p.requires_grad}

    result = learner.train_step(on_policy, seed=0)

    assert not result.skipped and math.isfinite(result.metrics["loss"]) and result.metrics["grad_norm"] > 0
    assert result.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert any(not torch.equal(p, before[n]) for n, p in learner.model.named_parameters() if n in before)
