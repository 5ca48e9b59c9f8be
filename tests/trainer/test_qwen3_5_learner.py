"""The learner trains a LoRA on the hybrid Qwen 3.5: 'all-linear' reaches the Gated DeltaNet layers'
projections beside the attention and MLP ones, and one GRPO update moves every adapter."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from policy_server.models.families import family
from trainer.algo.grpo import token_logprobs
from trainer.algo.sequences import TrainingSequence
from trainer.config import TrainConfig
from trainer.learner.learner import Learner

LINEAR_ATTENTION = {"in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b", "out_proj"}
FULL_ATTENTION = {"q_proj", "k_proj", "v_proj", "o_proj"}
MLP = {"gate_proj", "up_proj", "down_proj"}


@pytest.fixture(scope="module")
def qwen3_5_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return family("qwen3_5").build_tiny(tmp_path_factory.mktemp("tiny-qwen3-5") / "model")


def _sequences(learner: Learner) -> list[TrainingSequence]:
    """Two random on-policy sequences (behaviour logprobs are the learner's own), one rewarded."""
    rng = random.Random(0)
    sequences = []
    for index, advantage in enumerate((1.0, -1.0)):
        ids = [rng.randrange(learner.model.config.vocab_size) for _ in range(80)]  # over a 64-token chunk
        with torch.no_grad():
            logprobs = token_logprobs(
                learner.model(input_ids=torch.tensor([ids])).logits, torch.tensor([ids])
            )
        mask = [0] * 40 + [1] * 40
        sequences.append(
            TrainingSequence(
                rollout_id=f"r{index}",
                token_ids=ids,
                loss_mask=mask,
                behavior_logprobs=[
                    lp if m else 0.0 for lp, m in zip(logprobs[0].tolist(), mask, strict=True)
                ],
                advantage=advantage,
                num_calls=1,
            )
        )
    return sequences


def test_one_lora_update_trains_the_linear_attention_layers_too(qwen3_5_dir: Path) -> None:
    config = TrainConfig.model_validate(
        {"learning_rate": 1e-2, "max_steps": 1, "loss_type": "grpo", "lora": {"r": 2}}
    )
    learner = Learner(qwen3_5_dir, config)
    assert config.lora.target_modules == "all-linear"
    adapted = {
        name.split(".lora_B")[0]: param.detach().clone()
        for name, param in learner.model.named_parameters()
        if "lora_B" in name
    }
    # Layer 0 is linear attention, layer 1 full attention.
    assert {name.rsplit(".", 1)[1] for name in adapted if ".layers.0." in name} == LINEAR_ATTENTION | MLP
    assert {name.rsplit(".", 1)[1] for name in adapted if ".layers.1." in name} == FULL_ATTENTION | MLP

    result = learner.train_step(_sequences(learner), seed=1)

    assert not result.skipped and result.metrics["grad_norm"] > 0
    # On-policy: the learner recomputes the behaviour logprobs it was given.
    assert result.metrics["fidelity_ratio_max"] == pytest.approx(1.0, abs=1e-5)
    moved = [
        name
        for name, before in adapted.items()
        if not torch.equal(learner.model.get_parameter(f"{name}.lora_B.default.weight"), before)
    ]
    assert sorted(moved) == sorted(adapted)
