"""`rft plan` on the hybrid Qwen 3.5 / 3.6 models (linear attention in three layers of four): parameter
counts equal to transformers' model built on the meta device, LoRA counts equal to peft's, the KV cache
of the full-attention layers only and the linear layers' states equal to what transformers' cache
holds, and the plan's lines for a Qwen 3.6 27B-shaped config.

``qwen3.6-27b.json`` (beside this test) carries Qwen/Qwen3.6-27B's text_config sizes as public code
states them (the same in several independent repositories, one of them noting it checked them against
the published config.json; slime's Megatron arguments for Qwen3.5-27B agree on the attention and MLP
sizes); the official file is not in this offline checkout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.config import TrainConfig
from trainer.scale.hybrid import LINEAR_ATTENTION_MODULES, LinearAttention
from trainer.scale.layout import vllm_needs
from trainer.scale.memory import ModelShape, ModelShapeError
from trainer.scale.placement import Gpu, Node
from trainer.scale.plan import make_plan, render
from trainer.scale.vllm_memory import vllm_need

CONFIGS = Path(__file__).parent / "model_configs"
# A small Qwen 3.5 MoE (4 layers: 3 linear, 1 full; 4 experts of width 24 and a shared one of 40).
SMALL_MOE = {
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "linear_num_key_heads": 1,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "moe_intermediate_size": 24,
    "shared_expert_intermediate_size": 40,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 100,
}


@pytest.fixture(scope="module")
def tiny_qwen3_5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from policy_server.models.families import family

    return family("qwen3_5").build_tiny(tmp_path_factory.mktemp("tiny-qwen3-5") / "model")


def _config(name: str, tiny_dir: Path) -> Any:
    """A transformers config: the tiny model's, transformers' defaults, or the 27B shape's."""
    import transformers as tf

    if name == "tiny":
        return tf.AutoConfig.from_pretrained(str(tiny_dir))
    if name == "qwen3.6-27b":
        return tf.Qwen3_5Config(**json.loads((CONFIGS / "qwen3.6-27b.json").read_text()))
    configs = {
        "Qwen3_5TextConfig": tf.Qwen3_5TextConfig,
        "Qwen3_5TextConfig tied": lambda: tf.Qwen3_5TextConfig(tie_word_embeddings=True),
        "Qwen3_5MoeTextConfig": tf.Qwen3_5MoeTextConfig,
        "Qwen3_5Config": tf.Qwen3_5Config,
        "Qwen3_5MoeConfig": tf.Qwen3_5MoeConfig,
    }
    return configs[name]()


def _language_model_parameters(config: Any) -> tuple[int, int]:
    """(all parameters, those one token multiplies by) of the language model transformers builds for
    ``config`` on the meta device: a vision-language config's whole model without its vision tower
    (``model.visual``), which the plan does not count; the active ones leave out the input embedding
    and the routed experts a token's router does not pick (experts_per_token of num_experts)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    vision = hasattr(config, "vision_config")
    with torch.device("meta"):
        model = (AutoModelForImageTextToText if vision else AutoModelForCausalLM).from_config(config)
    text = config.get_text_config()
    experts = getattr(text, "num_experts", 0)
    idle = (experts - text.num_experts_per_tok) / experts if experts else 0.0
    total = active = 0
    for name, parameter in model.named_parameters():  # a tied head's weight is the embedding's
        if ".visual." in f".{name}":
            continue
        total += parameter.numel()
        if "embed_tokens" in name and not text.tie_word_embeddings:
            continue
        active += parameter.numel() - (round(parameter.numel() * idle) if ".mlp.experts." in name else 0)
    return total, active


@pytest.mark.parametrize(
    "name",
    [
        "tiny",
        "Qwen3_5TextConfig",
        "Qwen3_5TextConfig tied",
        "Qwen3_5MoeTextConfig",
        "Qwen3_5Config",
        "Qwen3_5MoeConfig",
        "qwen3.6-27b",
    ],
)
def test_parameters_equal_the_meta_model(name: str, tiny_qwen3_5: Path) -> None:
    config = _config(name, tiny_qwen3_5)
    shape = ModelShape.from_config(config.to_dict())
    assert shape.linear is not None and shape.gated_attention
    assert shape.linear_layers == (1 if name == "tiny" else 3 * shape.full_layers)
    total, active = _language_model_parameters(config)
    assert shape.parameters() == total
    assert shape.active_parameters() == active


def test_published_sizes_of_the_27b_shape() -> None:
    shape = ModelShape.from_config(json.loads((CONFIGS / "qwen3.6-27b.json").read_text()))
    assert (shape.layers, shape.linear_layers, shape.full_layers) == (64, 48, 16)
    # The language model: 26.90 B (the checkpoint's vision tower, not counted, comes on top).
    assert shape.parameters() == 26_895_998_464


@pytest.mark.parametrize(
    ("targets", "moe"),
    [
        ("all-linear", False),
        (["q_proj", "in_proj_qkv", "out_proj", "down_proj"], False),
        ("all-linear", True),
        (["gate_proj", "in_proj_z"], True),
    ],
)
def test_lora_counts_equal_peft(targets: list[str] | str, moe: bool, tiny_qwen3_5: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen3_5MoeTextConfig

    config = Qwen3_5MoeTextConfig(**SMALL_MOE) if moe else AutoConfig.from_pretrained(str(tiny_qwen3_5))
    model = get_peft_model(AutoModelForCausalLM.from_config(config), LoraConfig(r=16, target_modules=targets))
    trainable = sum(param.numel() for param in model.parameters() if param.requires_grad)
    shape = ModelShape.from_config(config.to_dict())
    assert shape.lora_parameters(16, targets) == trainable
    if targets == "all-linear" and not moe:
        assert trainable == 79_936  # the tiny model: one linear layer, one full
        wrapped = {
            name.rpartition(".")[2] for name, module in model.named_modules() if hasattr(module, "lora_A")
        }
        assert set(LINEAR_ATTENTION_MODULES) <= wrapped and "conv1d" not in wrapped
        assert shape.most_adapted_modules(targets) == len(shape.adapted_modules(targets, linear=True)) == 8


def test_kv_cache_and_states_equal_transformers_cache(tiny_qwen3_5: Path) -> None:
    from transformers import AutoModelForCausalLM

    shape = ModelShape.from_model_dir(tiny_qwen3_5)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_qwen3_5), dtype=torch.bfloat16)
    rows, length = 3, 7
    cache = model(torch.arange(rows * length).reshape(rows, length) + 5, use_cache=True).past_key_values
    kv = states = 0
    for layer in cache.layers:
        for tensor in [getattr(layer, "keys", None), getattr(layer, "values", None)]:
            kv += tensor.numel() * tensor.element_size() if tensor is not None else 0
        for held in [
            *getattr(layer, "conv_states", {}).values(),
            *getattr(layer, "recurrent_states", {}).values(),
        ]:
            states += held.numel() * held.element_size()
    # One full layer: k and v of 1 head x 64, bf16. One linear layer: conv state 512 channels x 4
    # (bf16) and recurrent state 2 heads x 128 x 128 (float32).
    assert shape.kv_bytes_per_token(2) * rows * length == kv == 2 * 64 * 2 * rows * length
    assert shape.state_bytes_per_sequence(2) * rows == states == (512 * 4 * 2 + 2 * 128 * 128 * 4) * rows


def test_linear_activations_are_near_what_autograd_saves(tiny_qwen3_5: Path) -> None:
    """The linear layers' estimate against the tensors autograd keeps for one of the tiny model's (its
    frozen weights and its input left out, bf16, the reference PyTorch path; LoRA's inputs are
    :meth:`ModelShape.lora_activation_bytes`)."""
    from transformers import AutoModelForCausalLM

    shape = ModelShape.from_model_dir(tiny_qwen3_5)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_qwen3_5), dtype=torch.bfloat16)
    mixer = model.model.layers[0].linear_attn.requires_grad_(False)  # frozen, as under LoRA
    skip = {param.untyped_storage().data_ptr() for param in mixer.parameters()}
    tokens = 256
    hidden = torch.randn(1, tokens, shape.hidden, dtype=torch.bfloat16, requires_grad=True)
    skip.add(hidden.untyped_storage().data_ptr())
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in skip:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        mixer(hidden)
    assert shape.linear is not None
    estimate = shape.linear.activation_bytes_per_token(2) * tokens
    assert estimate == pytest.approx(sum(saved.values()), rel=0.02)  # 21,576 a token against 21,600


def test_activations_count_each_kind_of_layer() -> None:
    # Without layer_types, every fourth layer is full attention, as transformers fills them in; a
    # config without the linear layers' sizes is refused, naming the one it lacks.
    moe = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")
    sizes = {key: value for key, value in SMALL_MOE.items() if key not in moe}
    dense = {"model_type": "qwen3_5_text", **sizes, "intermediate_size": 96}
    with pytest.raises(ModelShapeError, match="linear_conv_kernel_dim"):
        ModelShape.from_config(dense)
    shape = ModelShape.from_config({**dense, "linear_conv_kernel_dim": 4})
    linear = LinearAttention(1, 2, 16, 16, 4)
    assert shape.linear == linear and (shape.linear_layers, shape.full_layers) == (3, 1)
    common = (4 * 64 + 4 * 96) * 2  # the input and norms, the MLP's gate, up, activation, product
    full = common + (2 * 64 * 2 + 2 * 32) * 2  # gated q (gate and gated output) and q, k, v
    mixer = common + linear.activation_bytes_per_token(2)
    assert shape.activation_bytes(1, 2, checkpointing=False) == 3 * mixer + full + max(mixer, full)
    assert shape.activation_bytes(1, 2, checkpointing=True) == 4 * 64 * 2 + 2 * max(mixer, full)


def test_the_plan_counts_kv_and_states_for_the_27b_shape() -> None:
    config = json.loads((CONFIGS / "qwen3.6-27b.json").read_text())
    shape = ModelShape.from_config(config)
    train = TrainConfig.model_validate(
        {
            "engine": "hf",
            "learner": {"device": "cuda:0", "dtype": "bfloat16", "gradient_checkpointing": True},
            "hf": {"device": "cuda:1"},
            "lora": {"r": 16, "target_modules": "all-linear"},
        }
    )
    plan = make_plan(train, shape, Node([Gpu(0, 141 * 10**9), Gpu(1, 141 * 10**9)], present=True))
    engine = {item.label: item.bytes for item in plan.devices[1].items}
    tokens = 64 * 2 * 512  # hf.max_batch_size rows, prompts as long as max_completion_length
    # 16 full-attention layers x 4 kv heads x 256 x (k and v) x 2 bytes: 64 KiB a token, not 256.
    assert engine["hf engine KV cache (65536 tokens, 16 full-attention layers)"] == 65_536 * tokens
    # 48 linear layers x (conv 10240 channels x 4 x 2 bytes + recurrent 48 x 128 x 128 x 4 bytes).
    per_row = 48 * (10_240 * 4 * 2 + 48 * 128 * 128 * 4)
    assert shape.state_bytes_per_sequence(2) == per_row == 154_927_104
    assert engine["hf engine linear-attention states (64 rows x 48 layers)"] == 64 * per_row
    assert "(64 layers: 48 linear attention, 16 full, hidden 5120" in render(plan)
    vllm = TrainConfig.model_validate({"engine": "vllm", "vllm": {"max_model_len": 32768}})
    need = vllm_needs(vllm, shape, 1)
    rank = vllm.vllm.lora_rank_for(vllm.adapter_rank())
    loras = vllm.vllm.max_loras * shape.lora_parameters(rank, vllm.lora.target_modules)
    # Besides: the forward's working memory at 8192 batched tokens and the CUDA graphs.
    working = vllm_need(vllm, shape, 1).working
    assert need == (shape.parameters() + loras) * 2 + 65_536 * 32_768 + per_row + 10**9 + working
