"""What each learner process holds (:func:`learner_items`): the base model's weights (whole, or a
1/processes shard under FSDP2 with one decoder layer gathered at a time), the LoRA parameters with
their gradients and AdamW state (sharded likewise), and, during the update, one micro-batch's
activations, what peft's LoRA keeps for its backward, rebuilt expert stacks, eager attention's scores
where the family trains with eager attention, and the output head's logits chunk.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from trainer.config import TrainConfig
from trainer.scale.device_plan import Item, process_overhead
from trainer.scale.memory import DTYPE_BYTES, LORA_TRAINING_BYTES, ModelShape
from trainer.scale.placement import Placement

# FSDP2 gathers a unit's parameters before it runs and prefetches the next: two decoder layers in
# full at once, besides the root unit (embeddings, final norm, output head).
GATHERED_LAYERS = 2


def shards(config: TrainConfig, placement: Placement) -> int:
    """How many shards the base model is split into: the learner's processes (with a ``ray``
    section, its learner workers, each planned like this node's learner process) under
    ``learner.shard: fsdp`` ('auto' is resolved by :func:`trainer.scale.choices.resolve` before a run
    and counts as unsharded here), else 1 (each process holds the whole model)."""
    if config.learner.shard != "fsdp":
        return 1
    return config.ray.learner_workers if config.ray is not None else len(placement.learner_process_devices)


def learner_items(config: TrainConfig, shape: ModelShape, placement: Placement, device: str) -> list[Item]:
    """What the learner process on ``device`` holds."""
    width = DTYPE_BYTES[placement.learner_dtype]
    lora = config.lora
    rank = lora.r
    items = _weights(config, shape, placement.learner_dtype, shards(config, placement))
    tokens = config.max_tokens_per_microbatch
    checkpointing = config.learner.gradient_checkpointing
    chunk = min(config.learner.logits_chunk_size, tokens)
    kept = shape.lora_activation_bytes(
        tokens, rank, lora.target_modules, width, checkpointing, dropout=lora.lora_dropout > 0
    )
    modules = shape.most_adapted_modules(lora.target_modules)
    items += [
        Item(
            f"activations ({tokens} tokens/micro-batch, checkpointing {'on' if checkpointing else 'off'})",
            shape.activation_bytes(tokens, width, checkpointing),
            "update",
        ),
        Item(f"LoRA inputs kept for backward ({modules} adapted modules/layer, float32)", kept, "update"),
        *(
            Item(label, size, "update")
            for label, size in update_extras(
                shape, tokens, rank, lora.target_modules, lora.target_parameters, width, checkpointing
            )
        ),
        Item(
            f"logits chunk ({chunk} positions x {shape.vocab} vocab)",
            shape.logits_bytes(chunk, width),
            "update",
        ),
    ]
    return items + process_overhead(device, "learner")


def _weights(config: TrainConfig, shape: ModelShape, dtype: str, parts: int) -> list[Item]:
    width = DTYPE_BYTES[dtype]
    lora = shape.lora_parameters(config.lora.r, config.lora.target_modules, config.lora.target_parameters)
    reference = lora * 4 if config.init_adapter is not None and config.beta > 0 else 0
    params, vision = shape.parameters(), shape.vision_parameters
    tower = f" + {vision / 1e9:.2f} B vision tower" if vision else ""
    if parts == 1:
        return [
            Item(f"learner weights ({params / 1e9:.2f} B params{tower}, {dtype})", (params + vision) * width),
            Item(
                f"LoRA r={config.lora.r} + grads + AdamW ({lora / 1e6:.1f} M params, float32)",
                lora * LORA_TRAINING_BYTES + reference,
            ),
        ]
    embeddings = shape.vocab * shape.hidden * (1 if shape.tied_embeddings else 2)
    layer = (params - embeddings) // shape.layers
    return [
        Item(
            f"learner weights, a 1/{parts} FSDP2 shard ({params / 1e9:.2f} B params{tower}, {dtype})",
            (params + vision) * width // parts,
        ),
        Item(
            f"gathered: {GATHERED_LAYERS} decoder layers and the embeddings + output head"
            f"{' + vision tower' if vision else ''} ({dtype})",
            (GATHERED_LAYERS * layer + embeddings + vision) * width,
            "update",
        ),
        Item(
            f"LoRA r={config.lora.r} + grads + AdamW, a 1/{parts} shard ({lora / 1e6:.1f} M params, float32)",
            (lora * LORA_TRAINING_BYTES + reference) // parts,
        ),
    ]


def expert_lora_bytes(
    shape: ModelShape,
    rank: int,
    targets: Iterable[str] | str,
    target_parameters: Sequence[str],
    dtype_bytes: int,
    checkpointing: bool,
) -> int:
    """What LoRA on stacked parameters keeps in the update: peft rebuilds each adapted stack in full
    (W + BA, in the model's dtype) on every forward, and the backward keeps it; each layer keeps its
    own (with checkpointing, only the layer being recomputed), and the backward holds one layer's
    stacks' gradient besides."""
    stacks = shape.adapted_experts(rank, targets, target_parameters)
    per_layer = sum(stack.weights for stack in stacks) * dtype_bytes
    return per_layer * ((1 if checkpointing else shape.layers) + 1)


def update_extras(
    shape: ModelShape,
    tokens: int,
    rank: int,
    targets: Iterable[str] | str,
    target_parameters: Sequence[str],
    dtype_bytes: int,
    checkpointing: bool,
) -> list[tuple[str, int]]:
    """What the update holds besides :meth:`ModelShape.activation_bytes` where LoRA adapts stacked
    parameters, or the family trains with eager attention (the only one that keeps [T, T] scores) or a
    block-wise one (a block's scores, one layer at a time; a fused kernel's few rows count as
    nothing): (label, bytes) for the plan."""
    extras = []
    stacks = shape.adapted_experts(rank, targets, target_parameters)
    if stacks:
        names = ", ".join(stack.name for stack in stacks)
        size = expert_lora_bytes(shape, rank, targets, target_parameters, dtype_bytes, checkpointing)
        extras.append((f"stacks rebuilt with LoRA for the backward ({names})", size))
    if shape.attention_block:
        label = f"attention's working scores (one layer, blocks of {shape.attention_block} queries, float32)"
        extras.append((label, shape.attention_block_bytes(tokens)))
    if shape.eager_attention:
        extras.append(
            (
                f"eager attention scores ([rows, {shape.heads} heads, T, T] per layer)",
                shape.eager_attention_bytes(tokens, dtype_bytes, checkpointing),
            )
        )
    return extras
