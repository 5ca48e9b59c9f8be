"""``rft plan CONFIG``: will this run fit? Memory per device, estimated from the model's config.json.

For every device the placement uses, the plan adds up what lives there: the learner's weights, its
LoRA parameters with their gradients and AdamW state, the activations of one micro-batch at the
token budget (with or without gradient checkpointing), the output head's logits chunk, the hf
engine's copy and KV cache, and vLLM's share of the GPU. Two phases: rollouts (vLLM awake, no
activations) and the update (activations; vLLM asleep when sleep mode is on). A device whose peak
exceeds its memory refuses the config with a sentence that names a change that makes it fit (each
suggestion is checked by planning again with it). ``rft train`` runs the same check first.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainer.config import TrainConfig
from trainer.scale.layout import CUDA_OVERHEAD_BYTES, vllm_needs
from trainer.scale.memory import DTYPE_BYTES, GB, LORA_TRAINING_BYTES, ModelShape, ModelShapeError
from trainer.scale.phases import NodeWork, node_work, render_work, work_dict
from trainer.scale.placement import Node, Placement, detect_gpus, node_for, place

Phase = Literal["always", "rollouts", "update"]
log = logging.getLogger(__name__)


class PlanError(ValueError):
    """The config cannot fit (or cannot be planned); the message says what to change."""


@dataclass(frozen=True)
class Item:
    label: str
    bytes: int
    phase: Phase = "always"


@dataclass
class DevicePlan:
    """What one device holds; ``capacity`` is None when its memory is unknown."""

    device: str
    capacity: int | None
    items: list[Item] = field(default_factory=list)

    def phase_total(self, phase: Phase) -> int:
        return sum(item.bytes for item in self.items if item.phase in ("always", phase))

    @property
    def peak(self) -> tuple[int, Phase]:
        rollouts, update = self.phase_total("rollouts"), self.phase_total("update")
        return (update, "update") if update >= rollouts else (rollouts, "rollouts")

    @property
    def fits(self) -> bool:
        return self.capacity is None or self.peak[0] <= self.capacity


@dataclass
class Plan:
    """The memory plan of a config on a node."""

    shape: ModelShape
    placement: Placement
    node: Node
    devices: list[DevicePlan]
    problems: list[str] = field(default_factory=list)
    work: NodeWork | None = None  # what each GPU does per phase

    @property
    def fits(self) -> bool:
        return not self.problems and all(device.fits for device in self.devices)

    def as_dict(self) -> dict[str, Any]:
        return {
            "parameters": self.shape.parameters(),
            "active_parameters": self.shape.active_parameters(),
            "gpus_present": self.node.present,
            "placement": {
                "learner": self.placement.learner_device,
                "learner_dtype": self.placement.learner_dtype,
                "engine": self.placement.engine_device,
                "vllm_devices": self.placement.vllm_devices,
                "vllm_tensor_parallel": self.placement.vllm_tensor_parallel,
                "vllm_data_parallel": self.placement.vllm_data_parallel,
            },
            "devices": [
                {
                    "device": device.device,
                    "capacity_gb": device.capacity / GB if device.capacity is not None else None,
                    "items": {item.label: round(item.bytes / GB, 3) for item in device.items},
                    "peak_gb": round(device.peak[0] / GB, 3),
                    "peak_phase": device.peak[1],
                    "fits": device.fits,
                }
                for device in self.devices
            ],
            "problems": self.problems,
            "fits": self.fits,
            "phases": work_dict(self.work) if self.work is not None else None,
        }


def _device(plans: dict[str, DevicePlan], node: Node, device: str) -> DevicePlan:
    if device not in plans:
        capacity = _host_memory()
        if device.startswith("cuda"):
            index = int(device.partition(":")[2] or 0)
            capacity = node.gpus[index].memory_bytes if index < len(node.gpus) else None
        plans[device] = DevicePlan(device, capacity)
    return plans[device]


def _host_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _process_overhead(device: str, owner: str) -> list[Item]:
    return (
        [Item(f"{owner} CUDA context + allocator slack", CUDA_OVERHEAD_BYTES)]
        if device.startswith("cuda")
        else []
    )


def _learner_items(config: TrainConfig, shape: ModelShape, placement: Placement) -> list[Item]:
    dtype = placement.learner_dtype
    width = DTYPE_BYTES[dtype]
    tokens = config.max_tokens_per_microbatch
    lora = shape.lora_parameters(config.lora.r, config.lora.target_modules, config.lora.target_parameters)
    reference = lora * 4 if config.init_adapter is not None and config.beta > 0 else 0
    checkpointing = config.learner.gradient_checkpointing
    chunk = min(config.learner.logits_chunk_size, tokens)
    return [
        Item(
            f"learner weights ({shape.parameters() / 1e9:.2f} B params, {dtype})", shape.parameters() * width
        ),
        Item(
            f"LoRA r={config.lora.r} + grads + AdamW ({lora / 1e6:.1f} M params, float32)",
            lora * LORA_TRAINING_BYTES + reference,
        ),
        Item(
            f"activations ({tokens} tokens/micro-batch, checkpointing {'on' if checkpointing else 'off'})",
            shape.activation_bytes(tokens, width, checkpointing),
            "update",
        ),
        Item(
            f"LoRA inputs kept for backward ({shape.most_adapted_modules(config.lora.target_modules)} "
            "adapted modules/layer, float32)",
            shape.lora_activation_bytes(
                tokens,
                config.lora.r,
                config.lora.target_modules,
                width,
                checkpointing,
                dropout=config.lora.lora_dropout > 0,
            ),
            "update",
        ),
        *(
            Item(label, size, "update")
            for label, size in shape.update_extras(
                tokens,
                config.lora.r,
                config.lora.target_modules,
                config.lora.target_parameters,
                width,
                checkpointing,
            )
        ),
        Item(
            f"logits chunk ({chunk} positions x {shape.vocab} vocab)",
            shape.logits_bytes(chunk, width),
            "update",
        ),
        *_process_overhead(placement.learner_device, "learner"),
    ]


def _hf_engine_items(config: TrainConfig, shape: ModelShape, placement: Placement) -> list[Item]:
    dtype = placement.engine_dtype
    width = DTYPE_BYTES[dtype]
    # A KV cache for every running row (prompts assumed as long as completions) in the full-attention
    # layers; a hybrid model's linear-attention layers keep fixed-size states per row instead.
    rows = config.hf.max_batch_size
    tokens = rows * 2 * config.max_completion_length
    full = f", {shape.full_layers} full-attention layers" if shape.linear_layers else ""
    items = [
        Item(f"hf engine weights ({dtype})", shape.parameters() * width),
        Item(f"hf engine KV cache ({tokens} tokens{full})", shape.kv_bytes_per_token(width) * tokens),
    ]
    if shape.linear_layers:
        label = f"hf engine linear-attention states ({rows} rows x {shape.linear_layers} layers)"
        items.append(Item(label, shape.state_bytes_per_sequence(width) * rows))
    if placement.engine_device != placement.learner_device:
        items += _process_overhead(placement.engine_device, "hf engine")
    return items


def _vllm_items(
    config: TrainConfig, shape: ModelShape, placement: Placement, plans: dict[str, DevicePlan], node: Node
) -> list[str]:
    """Add vLLM's share to each of its GPUs; return the problems (a share too small for vLLM)."""
    vllm, problems = config.vllm, []
    need, context = vllm_needs(config, shape, placement.vllm_tensor_parallel)
    awake: Phase = "rollouts" if vllm.enable_sleep_mode else "always"
    for index in placement.vllm_devices:
        device = _device(plans, node, f"cuda:{index}")
        # vLLM takes its share of the GPU's total memory (its CUDA context included).
        if device.capacity:
            share = int(vllm.gpu_memory_utilization * device.capacity)
            label = f"vLLM share ({vllm.gpu_memory_utilization:g} of the GPU)"
        else:
            share, label = need, f"vLLM at least (weights, LoRA slots, one {context}-token sequence)"
        device.items.append(Item(label, share, awake))
        if vllm.enable_sleep_mode:
            device.items.append(Item("vLLM asleep (its CUDA context)", CUDA_OVERHEAD_BYTES, "update"))
        if share < need:
            states = " and linear-attention states" if shape.linear_layers else ""
            problems.append(
                f"vLLM's share of {device.device} ({share / GB:.1f} GB) cannot hold its weights, LoRA "
                f"slots and one {context}-token sequence's KV cache{states} ({need / GB:.1f} GB): raise "
                "vllm.gpu_memory_utilization, set a smaller vllm.max_model_len, or raise "
                "vllm.tensor_parallel_size"
            )
    return problems


def make_plan(config: TrainConfig, shape: ModelShape, node: Node) -> Plan:
    """The memory plan of ``config`` for a model of ``shape`` on ``node`` (no advice)."""
    config = config.model_copy(update={"lora": config.lora.as_trained(config.init_adapter)})
    placement = place(config, node, shape)
    plans: dict[str, DevicePlan] = {}
    _device(plans, node, placement.learner_device).items.extend(_learner_items(config, shape, placement))
    problems: list[str] = []
    if config.engine == "hf" and config.ray is None:
        _device(plans, node, placement.engine_device).items.extend(_hf_engine_items(config, shape, placement))
    elif placement.vllm_devices:
        problems = _vllm_items(config, shape, placement, plans, node)
    return Plan(shape, placement, node, list(plans.values()), problems, node_work(config, placement, node))


def _changed(config: TrainConfig, changes: dict[str, Any]) -> TrainConfig:
    data = config.model_dump()
    for key, value in changes.items():
        node = data
        *sections, last = key.split(".")
        for section in sections:
            node = node[section]
        node[last] = value
    return TrainConfig.model_validate(data)


def _candidates(config: TrainConfig, plan: Plan) -> list[dict[str, Any]]:
    """Changes worth trying, one lever at a time, then two together."""
    levers: list[dict[str, Any]] = []
    free = [gpu.index for gpu in plan.node.gpus if gpu.index not in plan.placement.vllm_devices]
    if plan.placement.shared_gpus and free:
        levers.append({"learner.device": f"cuda:{free[0]}"})
    if not config.learner.gradient_checkpointing:
        levers.append({"learner.gradient_checkpointing": True})
    if plan.placement.learner_dtype == "float32" and plan.placement.learner_device.startswith("cuda"):
        levers.append({"learner.dtype": "bfloat16"})
    if plan.placement.shared_gpus and not config.vllm.enable_sleep_mode:
        levers.append({"vllm.enable_sleep_mode": True})
    tokens = config.max_tokens_per_microbatch // 2
    while tokens >= 256:
        levers.append({"max_tokens_per_microbatch": tokens})
        tokens //= 2
    if plan.placement.shared_gpus:
        share = config.vllm.gpu_memory_utilization - 0.05
        while share > 0.04:
            levers.append({"vllm.gpu_memory_utilization": round(share, 2)})
            share -= 0.05
    pairs = [{**a, **b} for i, a in enumerate(levers[:3]) for b in levers[i + 1 :] if a.keys() != b.keys()]
    return levers + pairs


def advice(config: TrainConfig, plan: Plan) -> str:
    """Why it does not fit and what to change: a sentence per problem."""
    device = next((device for device in plan.devices if not device.fits), None)
    sentences = [_device_advice(config, plan, device)] if device is not None else []
    return " ".join(sentences + plan.problems)


def _device_advice(config: TrainConfig, plan: Plan, device: DevicePlan) -> str:
    """Why ``device`` overflows and the first checked change that makes the whole plan fit."""
    peak, phase = device.peak
    assert device.capacity is not None
    head = (
        f"{device.device} needs about {peak / GB:.1f} GB at its peak (during the {phase}) but has "
        f"{device.capacity / GB:.1f} GB"
    )
    for changes in _candidates(config, plan):
        trial = make_plan(_changed(config, changes), plan.shape, plan.node)
        if trial.fits:
            setting = " and ".join(f"{key}={json.dumps(value)}" for key, value in changes.items())
            largest = max(trial.devices, key=lambda d: d.peak[0])
            return (
                f"{head}; it fits with {setting} (then the largest peak is {largest.peak[0] / GB:.1f} GB, "
                f"on {largest.device})."
            )
    weights = plan.shape.parameters() * DTYPE_BYTES[plan.placement.learner_dtype]
    other_gpu = "" if config.ray is not None else " put vLLM on another GPU (vllm.devices),"
    return (
        f"{head}, and no setting rftkit can change makes it fit (the learner's weights alone take "
        f"{weights / GB:.1f} GB in {plan.placement.learner_dtype}): use a GPU with more memory,"
        f"{other_gpu} or choose a smaller model."
    )


def check(config: TrainConfig, shape: ModelShape, node: Node) -> Plan:
    """The plan, or :class:`PlanError` with a sentence that says what to change."""
    plan = make_plan(config, shape, node)
    if not plan.fits:
        raise PlanError(f"this config does not fit: {advice(config, plan)}")
    return plan


def render(plan: Plan) -> str:
    """The plan as a table per device, for people."""
    placement, node = plan.placement, plan.node
    gpus = f"{len(node.gpus)} GPU(s)" + ("" if node.present else " planned for") if node.gpus else "no GPU"
    shape = plan.shape
    active = f", {shape.active_parameters() / 1e9:.3f} B active per token" if shape.experts else ""
    hybrid = (
        f": {shape.linear_layers} linear attention, {shape.full_layers} full" if shape.linear_layers else ""
    )
    lines = [
        f"model: {shape.parameters() / 1e9:.3f} B parameters{active} ({shape.layers} layers{hybrid}, hidden "
        f"{shape.hidden}, vocabulary {shape.vocab}); node: {gpus}",
        f"placement: learner on {placement.learner_device} ({placement.learner_dtype}), engine on "
        f"{placement.engine_device} ({placement.engine_dtype})"
        + (f", sharing GPU {placement.shared_gpus[0]}" if placement.shared_gpus else "")
        + (
            f"; vLLM: {placement.vllm_data_parallel} replica(s) x {placement.vllm_tensor_parallel} GPU(s)"
            if placement.vllm_devices
            else ""
        ),
    ]
    if not node.present and any(device.device.startswith("cuda") for device in plan.devices):
        lines.append(
            "no GPU is present on this machine (torch sees no CUDA device): figures are estimates for "
            "the declared or named GPUs" + ("" if node.gpus else "; memory unknown, so nothing is checked")
        )
    for device in plan.devices:
        capacity = f"{device.capacity / GB:.1f} GB" if device.capacity is not None else "memory unknown"
        lines.append(f"{device.device} ({capacity}):")
        lines += [f"  {item.label:<66} {item.bytes / GB:8.2f} GB  [{item.phase}]" for item in device.items]
        peak, phase = device.peak
        verdict = "not checked" if device.capacity is None else "fits" if device.fits else "DOES NOT FIT"
        lines.append(f"  {'peak (' + phase + ')':<66} {peak / GB:8.2f} GB  {verdict}")
    return "\n".join(lines + (render_work(plan.work) if plan.work is not None else []))


def shape_for(model_dir: str | Path) -> ModelShape:
    """The model's sizes from its directory's config.json."""
    if not Path(model_dir).is_dir():
        raise PlanError(
            f"model {model_dir} is not a local directory: the plan reads its config.json; download "
            "the model to a directory and set model to it"
        )
    try:
        return ModelShape.from_model_dir(model_dir)
    except ModelShapeError as error:
        raise PlanError(str(error)) from None


def preflight(config: TrainConfig, model_dir: str | Path) -> Placement:
    """What ``rft train`` runs first: the placement, after checking the plan (:class:`PlanError`)."""
    node = node_for(config, detect_gpus())
    try:
        shape: ModelShape | None = shape_for(model_dir)
    except PlanError:
        shape = None  # a hub id the engine resolves itself: nothing to estimate from
    placement = place(config, node, shape)
    uses_cuda = placement.vllm_devices or any(
        device.startswith("cuda") for device in (placement.learner_device, placement.engine_device)
    )
    if uses_cuda and not node.present:
        raise PlanError(
            f"the config places the learner on {placement.learner_device} and the engine on "
            f"{placement.engine_device}, but torch sees no CUDA device here: set learner.device: cpu "
            "(and hf.device), or run on a machine with a GPU and a CUDA build of torch"
        )
    if shape is None:
        log.info("no memory plan: %s is not a local model directory", model_dir)
        return placement
    plan = check(config, shape, node)
    log.info("memory plan:\n%s", render(plan))
    return plan.placement
