"""What vLLM holds on each of its GPUs, counted from what it runs (:func:`vllm_need`): its weights as
the checkpoint stores them (a quantized checkpoint at its bits, :mod:`trainer.scale.quantization`),
the LoRA slots it reserves (``max_loras`` adapters at ``--max-lora-rank``, expert stacks included),
the KV cache the run's rollouts need (every rollout in flight holding ``ROLLOUT_TOKENS``, and at
least one ``max_model_len`` sequence, which vLLM checks at start; sliding-window
layers hold their window only), the forward's working memory, its CUDA graphs and its CUDA context.
``vllm.gpu_memory_utilization``, unless the user set it, is that total over the GPU's memory
(:func:`derived_utilization`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainer.config import TrainConfig
from trainer.scale.memory import CUDA_OVERHEAD_BYTES, DTYPE_BYTES, GB, ModelShape

# vLLM's scheduler budget a forward step runs on GPUs (--max-num-batched-tokens' default for the
# OpenAI server on a large GPU): what its profiling run sizes the activations by.
BATCHED_TOKENS = 8192
# The most of a GPU a derived share takes (what vLLM's worker cannot use: other processes' contexts).
MOST_SHARE = 0.95
# The tokens each rollout in flight is counted at (its prompt and completions so far): a multi-turn
# episode of the seeds' agents ends within it; vllm.max_model_len lowers it.
ROLLOUT_TOKENS = 8192
# The CUDA graphs vLLM captures for decode batch sizes (vLLM logs their size at start; about half a
# GB to 1.5 GB for these models): counted at the upper end.
CUDA_GRAPH_BYTES = int(1.5 * GB)


@dataclass(frozen=True)
class VllmNeed:
    """What one of vLLM's GPUs holds (bytes, its share of a tensor-parallel replica)."""

    weights: int
    loras: int
    kv_cache: int
    working: int  # the forward's activations at BATCHED_TOKENS, and the CUDA graphs
    context: int  # the CUDA context of its worker
    sequences: int  # rollouts in flight
    sequence_tokens: int  # the tokens each is counted at
    max_model_len: int
    minimum_kv: int  # one max_model_len sequence's KV cache (vLLM refuses to start below it)

    @property
    def total(self) -> int:
        return self.weights + self.loras + self.kv_cache + self.working + self.context

    @property
    def least(self) -> int:
        """The total with one ``max_model_len`` sequence's KV cache only."""
        return self.total - self.kv_cache + self.minimum_kv

    def with_kv(self, fraction: float) -> int:
        """The total with ``fraction`` of the KV cache the run's rollouts would fill beyond the least."""
        return self.least + int(fraction * max(self.kv_cache - self.minimum_kv, 0))


def serving_dtype(config: TrainConfig, shape: ModelShape) -> str:
    """vLLM's --dtype on GPUs: the setting, else ('auto') the checkpoint's own."""
    return config.vllm.dtype if config.vllm.dtype in DTYPE_BYTES else shape.dtype


def weight_bytes(shape: ModelShape, dtype_bytes: int) -> int:
    """The model's weights as vLLM loads them: quantized modules at the checkpoint's bits, the others
    (``modules_to_not_convert``, the embeddings, the head, norms, a vision tower) at ``dtype_bytes``."""
    quant = shape.quantization
    tower = shape.vision_parameters * dtype_bytes  # left unquantized, as the embeddings
    if quant is None:
        return shape.parameters() * dtype_bytes + tower
    embeddings = shape.vocab * shape.hidden
    attention = (
        shape.parameters()
        - embeddings * (1 if shape.tied_embeddings else 2)
        - shape.layers * (_mlp(shape) + 2 * shape.hidden)
    )
    groups = [
        ("model.embed_tokens", embeddings),
        ("lm_head", 0 if shape.tied_embeddings else embeddings),
        ("model.layers.0.self_attn", attention),
        ("model.layers.0.mlp.router", shape.layers * shape.hidden * shape.experts),
        (
            "model.layers.0.mlp.experts" if shape.experts else "model.layers.0.mlp",
            shape.layers * _mlp(shape, False),
        ),
        ("model.layers.0.input_layernorm", shape.layers * 2 * shape.hidden + shape.hidden),
    ]
    total = 0.0
    for module, count in groups:
        kept = quant.keeps(module) or module.endswith("layernorm")
        if module.endswith("router"):
            kept = kept or quant.keeps("model.layers.0.mlp.gate")
        total += count * (dtype_bytes if kept else quant.bits / 8)
    return int(total) + tower


def _mlp(shape: ModelShape, with_router: bool = True) -> int:
    """One layer's MLP parameters: the experts (and a shared expert), with or without the router."""
    dense = 3 * shape.hidden * shape.intermediate
    if not shape.experts:
        return dense
    shared = (
        3 * shape.hidden * shape.shared_expert_intermediate + shape.hidden
        if shape.shared_expert_intermediate
        else 0
    )
    return shape.experts * dense + shared + (shape.hidden * shape.experts if with_router else 0)


def vllm_need(config: TrainConfig, shape: ModelShape, tensor_parallel: int) -> VllmNeed:
    """What each of vLLM's GPUs holds for this run, split over ``tensor_parallel``."""
    vllm = config.vllm
    width = DTYPE_BYTES[serving_dtype(config, shape)]
    model_len = vllm.max_model_len or shape.max_positions or 4096
    sequences = min(config.max_concurrent_rollouts, config.rows_per_step * config.num_generations)
    length = min(model_len, ROLLOUT_TOKENS)
    state = shape.state_bytes_per_sequence(width)
    minimum = shape.kv_bytes(model_len, width) + state
    kv = max(sequences * (shape.kv_bytes(length, width) + state), minimum)
    rank = vllm.lora_rank_for(config.adapter_rank())
    loras = vllm.max_loras * shape.lora_parameters(
        rank, config.lora.target_modules, config.lora.target_parameters
    )
    q, kv_width = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    # Per batched token: the residual stream and norms, q/k/v and the attention output, the MLP's
    # gate/up and product for the experts each token visits.
    per_token = (
        4 * shape.hidden + 2 * q + 2 * kv_width + 3 * shape.intermediate * max(shape.experts_per_token, 1)
    )
    return VllmNeed(
        weights=weight_bytes(shape, width) // tensor_parallel,
        loras=loras * width // tensor_parallel,
        kv_cache=kv // tensor_parallel,
        working=BATCHED_TOKENS * per_token * width // tensor_parallel + CUDA_GRAPH_BYTES,
        context=CUDA_OVERHEAD_BYTES,
        sequences=sequences,
        sequence_tokens=length,
        max_model_len=model_len,
        minimum_kv=minimum // tensor_parallel,
    )


def derived_utilization(need: VllmNeed, gpu_bytes: int, kv_fraction: float = 1.0) -> float:
    """--gpu-memory-utilization that gives vLLM what it needs (:meth:`VllmNeed.with_kv`) over the
    GPU's memory, rounded up to a hundredth, at most ``MOST_SHARE``."""
    return min(math.ceil(need.with_kv(kv_fraction) / gpu_bytes * 100) / 100, MOST_SHARE)


def vllm_label(config: TrainConfig, shape: ModelShape, tensor_parallel: int) -> str:
    """How the weights are stored, for the plan's row."""
    dtype = serving_dtype(config, shape)
    stored = f"{shape.quantization.label()}, the rest {dtype}" if shape.quantization else dtype
    split = f", 1/{tensor_parallel} per GPU" if tensor_parallel > 1 else ""
    return f"vLLM weights ({stored}{split})"
