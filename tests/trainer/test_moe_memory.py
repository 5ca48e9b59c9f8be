"""`rft plan`'s counts for mixture-of-experts models and eager attention: total and active
parameters, LoRA on experts (peft's target_parameters, and the names peft converts), the expert
stacks peft rebuilds, eager attention's [rows, heads, T, T] scores. Small shapes computed by hand;
the LoRA counts checked against peft on tiny models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.trainer.moe_models import gpt_oss_dir, qwen3_moe_dir
from trainer.config import TrainConfig
from trainer.scale.learner_memory import expert_lora_bytes
from trainer.scale.memory import ModelShape
from trainer.scale.placement import Gpu, Node
from trainer.scale.plan import make_plan

CONFIGS = Path(__file__).parent / "model_configs"
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
# hidden 8, 2 layers, 2 heads of 4 (q: 8 features), 1 kv head (k, v: 4), 4 experts of width 6, 2 per
# token, vocabulary 10, untied, no attention bias.
SMALL = {
    "hidden_size": 8,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 4,
    "vocab_size": 10,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def _small(model_type: str, **sizes: object) -> ModelShape:
    if model_type == "gpt_oss":
        moe = {"intermediate_size": 6, "num_local_experts": 4, "experts_per_token": 2}
    else:
        moe = {
            "intermediate_size": 99,
            "moe_intermediate_size": 6,
            "num_experts": 4,
            "num_experts_per_tok": 2,
        }
    return ModelShape.from_config({"model_type": model_type, **SMALL, **moe, **sizes})


def test_total_and_active_parameters_by_hand() -> None:
    shape = _small("gpt_oss")
    assert (shape.experts, shape.experts_per_token, shape.intermediate) == (4, 2, 6)
    # Per layer: attention q 8x8 + k 8x4 + v 8x4 + o 8x8 = 192; 4 experts x (3 x 8 x 6 = 144) = 576
    # and the router 8 x 4 = 32; 2 norms of 8. Two layers, embeddings and head 2 x 10 x 8, final norm 8.
    assert shape.parameters() == 2 * (192 + 576 + 32 + 16) + 160 + 8 == 1800
    # A token runs through 2 of the 4 experts (2 idle x 144 per layer) and looks its embedding up.
    assert shape.active_parameters() == 1800 - 2 * 2 * 144 - 80 == 1144
    assert _small("qwen3_moe").parameters() == 1800  # moe_intermediate_size, not intermediate_size


def test_published_moe_sizes() -> None:
    gpt_oss = ModelShape.from_config(json.loads((CONFIGS / "gpt-oss-20b.json").read_text()))
    assert gpt_oss.active_parameters() == pytest.approx(3.61e9, rel=0.01)  # OpenAI's model card
    qwen = ModelShape.from_config(json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text()))
    assert qwen.parameters() == pytest.approx(30.5e9, rel=0.01)  # Qwen's model card ("3.3B activated"
    assert qwen.active_parameters() == pytest.approx(3.04e9, rel=0.01)  # counts the embeddings too)


def test_lora_on_experts_by_hand() -> None:
    shape = _small("gpt_oss")
    # r=2 on q_proj (8 in, 8 out): 2 x 16 = 32; gate_up stack [4 experts, 8 in, 12 out]: 2 x 4 x 20 = 160;
    # down [4, 6 in, 8 out]: 2 x 4 x 14 = 112. Per layer 304, two layers.
    assert shape.lora_parameters(2, ["q_proj"], EXPERTS) == 2 * (32 + 160 + 112) == 608
    # 'all-linear' reaches gpt-oss's attention only: q 32, k 2 x 12 = 24, v 24, o 32.
    assert shape.lora_parameters(2, "all-linear") == 2 * 112
    # Qwen3-MoE: peft maps 'all-linear' onto the experts (gate_up at rank 4: 4 x 4 x 20 = 320; down
    # 112) and the router's weight (8 in, 4 out: 2 x 12 = 24), besides the attention's 112.
    assert _small("qwen3_moe").lora_parameters(2, "all-linear") == 2 * (112 + 320 + 112 + 24) == 1136
    assert _small("qwen3_moe").lora_parameters(2, ["q_proj"]) == 2 * 32


def test_rebuilt_expert_stacks_and_eager_scores_by_hand() -> None:
    shape = _small("gpt_oss")
    # gate_up 4 x 8 x 12 = 384 and down 4 x 6 x 8 = 192 weights, 2 bytes each: 1152 per layer; kept by
    # both layers plus one layer's gradient, or (checkpointing) by the layer recomputed plus it.
    assert expert_lora_bytes(shape, 2, ["q_proj"], EXPERTS, 2, checkpointing=False) == 1152 * 3
    assert expert_lora_bytes(shape, 2, ["q_proj"], EXPERTS, 2, checkpointing=True) == 1152 * 2
    assert expert_lora_bytes(shape, 2, ["q_proj"], [], 2, checkpointing=False) == 0
    # 16 tokens as one row of T=16: 2 heads x 16 x 16 x 2 bytes = 1024 per layer; both layers keep
    # theirs and the running layer holds two more.
    assert shape.eager_attention_bytes(16, 2, checkpointing=False) == 1024 * 4
    assert shape.eager_attention_bytes(16, 2, checkpointing=True) == 1024 * 3
    # A context of 8 positions: two rows of T=8, 2 x 2 x 8 x 8 x 2 = 512 per layer.
    assert _small("gpt_oss", max_position_embeddings=8).eager_attention_bytes(16, 2, False) == 512 * 4


def test_the_plan_counts_them_for_gpt_oss_20b() -> None:
    config = json.loads((CONFIGS / "gpt-oss-20b.json").read_text())
    shape = ModelShape.from_config(config, eager_attention=True)
    train = TrainConfig.model_validate(
        {
            "learner": {"device": "cuda", "gradient_checkpointing": True},
            "max_tokens_per_microbatch": 4096,
            "lora": {"r": 16, "target_modules": ["q_proj", "v_proj"], "target_parameters": EXPERTS},
        }
    )
    plan = make_plan(train, shape, Node([Gpu(0, 141 * 10**9)], present=True))
    items = {item.label: item.bytes for item in plan.devices[0].items}
    stacks = items["stacks rebuilt with LoRA for the backward (gate_up_proj, down_proj)"]
    # 32 experts x 2880 x 5760 (gate_up) + 32 x 2880 x 2880 (down), bf16, twice (checkpointing).
    assert stacks == 32 * 2880 * (5760 + 2880) * 2 * 2
    # 4096 tokens in one row: 64 heads x 4096 x 4096, bf16, the recomputed layer's + two more.
    assert items["eager attention scores ([rows, 64 heads, T, T] per layer)"] == 64 * 4096 * 4096 * 2 * 3
    lora = shape.lora_parameters(16, ["q_proj", "v_proj"], EXPERTS)
    assert any(label.startswith("LoRA r=16") and size == lora * 16 for label, size in items.items())
    assert plan.as_dict()["active_parameters"] == shape.active_parameters()


def test_the_familys_eager_attention_reaches_the_shape(tiny_model_dir: Path, tmp_path: Path) -> None:
    # gpt_oss's family trains with rftkit's chunked attention (its sinks, no [T, T] scores kept);
    # qwen3's (Qwen3-MoE too) with SDPA: neither keeps eager attention's scores.
    assert not ModelShape.from_model_dir(gpt_oss_dir(tiny_model_dir, tmp_path / "gpt-oss")).eager_attention
    assert not ModelShape.from_model_dir(
        qwen3_moe_dir(tiny_model_dir, tmp_path / "qwen3-moe")
    ).eager_attention


@pytest.mark.parametrize(
    ("kind", "targets", "parameters"),
    [
        ("gpt_oss", ["q_proj"], EXPERTS),
        ("gpt_oss", "all-linear", []),
        ("qwen3_moe", "all-linear", []),
        ("qwen3_moe", ["q_proj", "v_proj"], EXPERTS),
    ],
)
def test_lora_counts_equal_peft_on_tiny_models(
    kind: str, targets: list[str] | str, parameters: list[str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    build = gpt_oss_dir if kind == "gpt_oss" else qwen3_moe_dir
    model_dir = build(tiny_model_dir, tmp_path / "model")
    shape = ModelShape.from_config(json.loads((model_dir / "config.json").read_text()))
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    lora = LoraConfig(r=2, target_modules=targets, target_parameters=parameters or None)
    model = get_peft_model(base, lora)
    trainable = sum(param.numel() for param in model.parameters() if param.requires_grad)
    assert shape.lora_parameters(2, targets, parameters) == trainable
