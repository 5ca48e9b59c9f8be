"""Mixture-of-experts models for training: gpt-oss loads dequantised in a stated dtype with its
family's attention, and LoRA reaches the experts (peft's target_parameters) in the learner, in a
saved adapter and in the hf engine, hot-loaded."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from policy_server.models.families import Family
from tests.trainer.moe_models import EXPERTS, gpt_oss_dir, quantize_experts_mxfp4, qwen3_moe_dir
from trainer.algo.grpo import token_logprobs
from trainer.algo.sequences import TrainingSequence
from trainer.config import TrainConfig
from trainer.learner.base_load import QuantizedBaseError, load_for_training
from trainer.learner.learner import Learner
from trainer.learner.model import LoraTargetError

EXPERT_PARAMETERS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


class EagerFamily(Family):
    """A family that names one of transformers' own attentions (eager) to train with."""

    name: ClassVar[str] = "eager-test"
    train_attn_implementation: ClassVar[str | None] = "eager"


@pytest.fixture(scope="module")
def gpt_oss(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gpt_oss_dir(tiny_model_dir, tmp_path_factory.mktemp("gpt-oss") / "model")


@pytest.fixture(scope="module")
def qwen3_moe(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qwen3_moe_dir(tiny_model_dir, tmp_path_factory.mktemp("qwen3-moe") / "model")


def test_mxfp4_experts_load_dequantised_in_the_dtype_asked_for(tiny_model_dir: Path, tmp_path: Path) -> None:
    model_dir = gpt_oss_dir(tiny_model_dir, tmp_path / "model")
    expected = quantize_experts_mxfp4(model_dir)

    model, loaded = load_for_training(model_dir, torch.float32)  # its family's (gpt_oss) attention

    for name, values in expected.items():
        parameter = model.get_parameter(name)
        assert parameter.dtype == torch.float32 and torch.equal(parameter, values), name
    assert not getattr(model, "is_quantized", False)
    assert loaded.dtype == "float32" and loaded.attn_implementation == "rftkit_chunked"
    assert loaded.dequantized_from == "mxfp4"
    assert loaded.params() == {
        "learner.loaded_dtype": "float32",
        "learner.attn_implementation": "rftkit_chunked",
        "learner.dequantized_from": "mxfp4",
    }


def test_a_quantized_checkpoint_transformers_cannot_dequantise_is_refused(
    gpt_oss: Path, tmp_path: Path
) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    config = json.loads((gpt_oss / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (model_dir / "config.json").write_text(json.dumps(config))

    with pytest.raises(QuantizedBaseError, match="quant_method 'bitsandbytes'.*unquantized"):
        load_for_training(model_dir, torch.float32, family=EagerFamily())


def test_the_attention_is_the_familys_or_transformers_default(qwen3_moe: Path) -> None:
    _, eager = load_for_training(qwen3_moe, torch.float32, family=EagerFamily())
    _, default = load_for_training(qwen3_moe, torch.float32, family=Family())
    assert (eager.attn_implementation, default.attn_implementation) == ("eager", "sdpa")
    assert eager.dequantized_from is None


def _sequences(learner: Learner, advantages: list[float]) -> list[TrainingSequence]:
    """Random prompts and completions scored by the learner's own model (on-policy)."""
    rng = random.Random(0)
    vocab = learner.model.config.vocab_size
    sequences = []
    for index, advantage in enumerate(advantages):
        ids = [rng.randrange(vocab) for _ in range(12)]
        with torch.no_grad():
            logprobs = token_logprobs(
                learner.model(input_ids=torch.tensor([ids])).logits, torch.tensor([ids])
            )
        mask = [0] * 6 + [1] * 6
        behavior = [lp if m else 0.0 for lp, m in zip(logprobs[0].tolist(), mask, strict=True)]
        sequences.append(
            TrainingSequence(
                rollout_id=f"r{index}",
                token_ids=ids,
                loss_mask=mask,
                behavior_logprobs=behavior,
                advantage=advantage,
                num_calls=1,
            )
        )
    return sequences


def _config(learner: dict[str, object] | None = None, **lora: object) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "learning_rate": 1e-2,
            "max_steps": 2,
            "loss_type": "grpo",
            "learner": learner or {},
            "lora": {"r": 2, **lora},
        }
    )


def test_the_learner_trains_lora_on_gpt_oss_experts(gpt_oss: Path) -> None:
    learner = Learner(gpt_oss, _config(target_modules=["q_proj"], target_parameters=EXPERT_PARAMETERS))
    experts = {
        name: param.detach().clone()
        for name, param in learner.model.named_parameters()
        if "experts" in name and "lora_B" in name
    }
    assert len(experts) == 4  # gate_up and down, 2 layers
    # [out, rank x experts]: each expert has its own rank-2 factors (both stacks' out are 64 here).
    assert {tuple(param.shape) for param in experts.values()} == {(64, 2 * EXPERTS)}
    assert learner.base_load.attn_implementation == "rftkit_chunked"  # the gpt_oss family's

    result = learner.train_step(_sequences(learner, [1.0, -1.0]), seed=1)

    assert not result.skipped and result.metrics["grad_norm"] > 0
    moved = [name for name, param in learner.model.named_parameters() if name in experts]
    assert all(not torch.equal(learner.model.get_parameter(name), experts[name]) for name in moved)
    # Gradient checkpointing recomputes each layer with its rebuilt expert stacks: the same gradient.
    checkpointing = {"gradient_checkpointing": True}
    checkpointed = Learner(
        gpt_oss, _config(checkpointing, target_modules=["q_proj"], target_parameters=EXPERT_PARAMETERS)
    )
    again = checkpointed.train_step(_sequences(checkpointed, [1.0, -1.0]), seed=1)
    assert again.metrics["grad_norm"] == pytest.approx(result.metrics["grad_norm"], rel=1e-5)


def test_target_parameters_that_name_nothing_stop_with_a_sentence(qwen3_moe: Path) -> None:
    with pytest.raises(
        LoraTargetError, match=r"mlp\.experts\.w13.*mlp\.experts\.down_proj, mlp\.experts\.gate_up_proj"
    ):
        Learner(qwen3_moe, _config(target_parameters=["mlp.experts.w13"]))


def test_lora_dropout_on_experts_stops_with_a_sentence(qwen3_moe: Path) -> None:
    with pytest.raises(ValueError, match="set lora_dropout: 0"):
        _config(lora_dropout=0.1, target_parameters=EXPERT_PARAMETERS)
    # Qwen3-MoE's experts are adapted from 'all-linear' too (peft maps the names onto the stacks).
    with pytest.raises(LoraTargetError, match=r"set lora\.lora_dropout: 0"):
        Learner(qwen3_moe, _config(lora_dropout=0.1))


def _experts_adapter(model_dir: Path, out: Path) -> Path:
    """A peft adapter on the experts only, its B factors random (a fresh one changes nothing)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=2, target_modules=[], target_parameters=EXPERT_PARAMETERS))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    model.save_pretrained(str(out))
    return out


@pytest.mark.parametrize("kind", ["gpt_oss", "qwen3_moe"])
def test_the_hf_engine_serves_and_hot_loads_an_experts_adapter(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from policy_server.engines.base import GenerationRequest
    from policy_server.engines.hf import HFEngine

    model_dir: Path = request.getfixturevalue(kind)
    adapter = _experts_adapter(model_dir, tmp_path / "adapter")

    async def sample() -> list[list[float]]:
        engine = HFEngine(model_dir, max_batch_size=2)
        await engine.start()
        try:
            logprobs = []
            for version in (0, 1, 2):
                if version:
                    await engine.load_adapter(version, str(adapter))  # 2: hot-loaded beside 1
                call = GenerationRequest(
                    messages=[{"role": "user", "content": "hello"}],
                    max_tokens=4,
                    seed=0,
                    adapter_version=version,
                )
                logprobs.append((await engine.generate(call)).completion_logprobs)
            return logprobs
        finally:
            await engine.close()

    base, first, second = asyncio.run(sample())
    assert first != base  # the experts' adapter reached the served model
    assert first == second  # the same adapter hot-loaded as another version samples the same


def test_rft_sft_warm_starts_an_experts_adapter(gpt_oss: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from trainer.sft.text import run_sft

    demonstrations = [
        {"messages": [{"role": "user", "content": f"say {word}"}, {"role": "assistant", "content": word}]}
        for word in ("yes", "no")
    ]
    result = run_sft(
        gpt_oss,
        demonstrations,
        tmp_path / "adapter",
        steps=2,
        batch_size=2,
        target_modules=["q_proj"],
        target_parameters=EXPERT_PARAMETERS,
    )

    config = json.loads((result.adapter_dir / "adapter_config.json").read_text())
    assert sorted(config["target_parameters"]) == sorted(EXPERT_PARAMETERS)
    weights = load_file(str(result.adapter_dir / "adapter_model.safetensors"))
    assert any(".mlp.experts.base_layer.lora_B" in name for name in weights)  # gate_up_proj's
    with pytest.raises(LoraTargetError, match="mlp.experts.up_proj"):
        run_sft(gpt_oss, demonstrations, tmp_path / "bad", steps=1, target_parameters=["mlp.experts.up_proj"])


def test_a_run_records_how_its_base_was_loaded(tiny_model_dir: Path, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from trainer.run import open_run

    (tmp_path / "train.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n")
    config = TrainConfig.model_validate(
        {
            "model": str(tiny_model_dir),
            "train_file": str(tmp_path / "train.jsonl"),
            "output_dir": str(tmp_path / "run"),
            "learner": {"device": "cpu"},
        }
    )
    run = open_run(config, resume=False)
    try:
        params = MlflowClient(config.mlflow_uri).get_run(run.state.mlflow_run_id).data.params
    finally:
        run.metrics.close()
    # learner.dtype says "auto"; the record says what it resolved to, and the attention used.
    assert "'dtype': 'auto'" in params["learner"]  # the config's section, logged as it was given
    assert params["learner.loaded_dtype"] == "float32"
    assert params["learner.attn_implementation"] == "sdpa"
    assert params["learner.dequantized_from"] == "none"
