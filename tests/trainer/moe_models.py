"""Tiny mixture-of-experts models for the tests: gpt-oss and Qwen3-MoE from transformers at a tiny
size (experts kept experts), with the tiny Llama's tokenizer, and gpt-oss written as its releases
ship it (MXFP4 experts, a ``quantization_config`` in config.json)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

# The sizes both tiny MoE models take: 4 experts, 2 per token, 2 layers.
EXPERTS, PER_TOKEN, HIDDEN, EXPERT_WIDTH = 4, 2, 64, 32
# E2M1 (FP4) values in code order, as the OCP microscaling spec defines them.
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
# MXFP4 scales are powers of two biased by 127; these experts are 2**-3 times their FP4 codes.
SCALE_EXPONENT = -3
_MODEL_FILES = ("config.json", "model.safetensors", "generation_config.json")


def _tokenizer_copy(tiny_model_dir: Path, out: Path) -> dict[str, Any]:
    """The tiny Llama's tokenizer files in ``out``; its config's token ids and sizes."""
    out.mkdir(parents=True, exist_ok=True)
    for path in tiny_model_dir.iterdir():
        if path.is_file() and path.name not in _MODEL_FILES:
            shutil.copy2(path, out / path.name)
    llama = json.loads((tiny_model_dir / "config.json").read_text())
    names = ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id", "max_position_embeddings")
    return {name: llama[name] for name in names if name in llama}


def gpt_oss_dir(tiny_model_dir: Path, out: Path, seed: int = 0) -> Path:
    """A tiny GptOss (eager attention, sinks, 4 experts) in ``out``, in float32."""
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(
        **_tokenizer_copy(tiny_model_dir, out),
        hidden_size=HIDDEN,
        intermediate_size=EXPERT_WIDTH,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=EXPERTS,
        num_experts_per_tok=PER_TOKEN,
        sliding_window=32,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(seed)
    GptOssForCausalLM(config).save_pretrained(str(out))
    return out


def qwen3_moe_dir(tiny_model_dir: Path, out: Path, seed: int = 0) -> Path:
    """A tiny Qwen3-MoE (4 experts, every layer sparse) in ``out``, in float32."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        **_tokenizer_copy(tiny_model_dir, out),
        hidden_size=HIDDEN,
        intermediate_size=128,
        moe_intermediate_size=EXPERT_WIDTH,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=EXPERTS,
        num_experts_per_tok=PER_TOKEN,
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(seed)
    Qwen3MoeForCausalLM(config).save_pretrained(str(out))
    return out


def quantize_experts_mxfp4(model_dir: Path, seed: int = 0) -> dict[str, torch.Tensor]:
    """Rewrite ``model_dir``'s expert weights as gpt-oss's releases store them: MXFP4 blocks
    ([experts, rows, columns/32, 16] bytes, two FP4 codes each, low nibble first) and scales (one
    biased exponent per 32 values), with ``quantization_config: {quant_method: mxfp4}`` in
    config.json. Returns the weights they dequantise to, as the model's parameters hold them."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(model_dir / "model.safetensors"))
    generator = torch.Generator().manual_seed(seed)
    lut = torch.tensor(FP4_VALUES)
    expected = {}
    for name in [name for name in weights if name.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        # transformers holds an expert stack as [experts, in, out]; the blocks run along ``in``.
        experts, columns, rows = weights.pop(name).shape
        codes = torch.randint(
            0, 16, (experts, rows, columns // 32, 32), generator=generator, dtype=torch.uint8
        )
        weights[f"{name}_blocks"] = (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()
        weights[f"{name}_scales"] = torch.full(
            (experts, rows, columns // 32), 127 + SCALE_EXPONENT, dtype=torch.uint8
        )
        values = lut[codes.long()] * 2.0**SCALE_EXPONENT
        expected[name] = values.reshape(experts, rows, columns).transpose(1, 2).contiguous()
    save_file(weights, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((model_dir / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    }
    (model_dir / "config.json").write_text(json.dumps(config, indent=1))
    return expected
