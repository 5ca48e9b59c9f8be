"""Model sizes from config.json alone: real published sizes, and the tiny model counted by torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainer.scale.memory import ModelShape

CONFIGS = Path(__file__).parent / "model_configs"

# Published parameter counts (model cards); the config.json files beside this test carry the
# published sizes (hidden, layers, heads, kv heads, head_dim, intermediate, vocabulary, tying).
PUBLISHED = {
    "smollm2-135m": 134.5e6,
    "qwen2.5-7b": 7.61e9,
    "llama-3-8b": 8.03e9,
    "qwen3-8b": 8.2e9,
    "gpt-oss-20b": 20.9e9,
    "llama-3.3-70b": 70.6e9,
    "gemma-4-31b": 30.7e9,  # the text model; global layers of head size 512, keys reused as values
    "qwen3-vl-8b": 8.19e9,  # the text model (the vision tower is not counted)
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_matches_the_published_one(name: str) -> None:
    shape = ModelShape.from_config(json.loads((CONFIGS / f"{name}.json").read_text()))
    assert shape.parameters() == pytest.approx(PUBLISHED[name], rel=0.02)


def test_llama_3_8b_lora_and_kv_sizes() -> None:
    shape = ModelShape.from_config(json.loads((CONFIGS / "llama-3-8b.json").read_text()))
    # peft reports 41,943,040 trainable parameters for r=16 on all seven projections of Llama-3-8B.
    assert shape.lora_parameters(16, "all-linear") == 41_943_040
    assert shape.lora_parameters(16, ["q_proj", "v_proj"]) == 32 * 16 * (4096 + 4096 + 4096 + 1024)
    # 32 layers x 8 kv heads x 128 x (k and v) x 2 bytes: 128 KiB per token in bf16.
    assert shape.kv_bytes_per_token(2) == 131_072
    with_checkpointing = shape.activation_bytes(8192, 2, checkpointing=True)
    assert with_checkpointing < shape.activation_bytes(8192, 2, checkpointing=False) / 5


def test_tiny_model_counts_equal_torch_and_peft(tiny_model_dir: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    shape = ModelShape.from_model_dir(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    assert shape.parameters() == sum(param.numel() for param in model.parameters())
    peft_model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    trainable = sum(param.numel() for param in peft_model.parameters() if param.requires_grad)
    assert shape.lora_parameters(8, "all-linear") == trainable


def test_a_config_without_sizes_is_refused() -> None:
    from trainer.scale.memory import ModelShapeError

    with pytest.raises(ModelShapeError, match="hidden_size"):
        ModelShape.from_config({"vocab_size": 10})


def test_gemma_4_31b_global_layers_are_counted_as_transformers_builds_them() -> None:
    from transformers import AutoModelForCausalLM, Gemma4TextConfig

    config = json.loads((CONFIGS / "gemma-4-31b.json").read_text())
    text = {key: value for key, value in config["text_config"].items() if key != "model_type"}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(Gemma4TextConfig(**text))
    built = sum(param.numel() for param in model.parameters())
    shape = ModelShape.from_config(config)
    assert (shape.global_layers, shape.sliding_layers, shape.sliding_window) == (10, 50, 1024)
    # Up to the q/k norms' few weights per layer (0.7 M of 30.7 B).
    assert shape.parameters() == pytest.approx(built, rel=1e-4)


def test_a_qwen_vision_tower_is_counted_as_transformers_builds_it() -> None:
    import transformers

    config = json.loads((CONFIGS / "qwen3-vl-8b.json").read_text())
    # Qwen 3.5's layout: no deepstack mergers (its published vision_config lists none).
    qwen3_5 = transformers.Qwen3_5Config()
    published_3_5 = {**qwen3_5.vision_config.to_dict(), "deepstack_visual_indexes": []}
    cases = [
        (transformers.Qwen3VLConfig(**{k: v for k, v in config.items() if k != "model_type"}), config),
        (qwen3_5, {"model_type": "qwen3_5", **qwen3_5.to_dict(), "vision_config": published_3_5}),
    ]
    for built_config, published in cases:
        with torch.device("meta"):
            model = transformers.AutoModelForImageTextToText.from_config(built_config)
        tower = sum(param.numel() for name, param in model.named_parameters() if ".visual." in f".{name}")
        assert ModelShape.from_config(published).vision_parameters == tower
    # Qwen3-VL-8B: 8.19 B in the language model and 0.576 B in the tower, 8.77 B as published.
    shape = ModelShape.from_config(config)
    assert shape.parameters() + shape.vision_parameters == pytest.approx(8.77e9, rel=0.005)
