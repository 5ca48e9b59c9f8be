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

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.config import TrainConfig
from trainer.scale.device_plan import DevicePlan, Item, Phase, device_plan, process_overhead
from trainer.scale.learner_memory import learner_items, shards
from trainer.scale.memory import CUDA_OVERHEAD_BYTES, DTYPE_BYTES, GB, ModelShape, ModelShapeError
from trainer.scale.phases import NodeWork, node_work, render_work, work_dict
from trainer.scale.placement import Node, Placement, place
from trainer.scale.vllm_memory import serving_dtype, vllm_label, vllm_need

log = logging.getLogger(__name__)


class PlanError(ValueError):
    """The config cannot fit (or cannot be planned); the message says what to change."""


@dataclass
class Plan:
    """The memory plan of a config on a node."""

    shape: ModelShape
    placement: Placement
    node: Node
    devices: list[DevicePlan]
    problems: list[str] = field(default_factory=list)
    work: NodeWork | None = None  # what each GPU does per phase
    serving_dtype: str | None = None  # vLLM's --dtype on GPUs (None: no vLLM rftkit starts on them)
    choices: list[str] = field(default_factory=list)  # what the plan chose and why (choices.resolve)
    shards: int = 1  # the learner's weights split over its processes (FSDP2); 1: each holds them whole

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
                "learner_devices": list(self.placement.learner_process_devices),
                "learner_dtype": self.placement.learner_dtype,
                "vllm_dtype": self.serving_dtype,
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
            "choices": self.choices,
            "fits": self.fits,
            "phases": work_dict(self.work) if self.work is not None else None,
        }


def _hf_engine_items(config: TrainConfig, shape: ModelShape, placement: Placement) -> list[Item]:
    dtype = placement.engine_dtype
    width = DTYPE_BYTES[dtype]
    # A KV cache for every running row (prompts assumed as long as completions) in the full-attention
    # layers; a hybrid model's linear-attention layers keep fixed-size states per row instead.
    rows = config.hf.max_batch_size
    length = 2 * config.max_completion_length
    full = f", {shape.full_layers} full-attention layers" if shape.linear_layers else ""
    items = [
        Item(f"hf engine weights ({dtype})", shape.parameters() * width),
        Item(f"hf engine KV cache ({rows * length} tokens{full})", shape.kv_bytes(length, width) * rows),
    ]
    if shape.linear_layers:
        label = f"hf engine linear-attention states ({rows} rows x {shape.linear_layers} layers)"
        items.append(Item(label, shape.state_bytes_per_sequence(width) * rows))
    if placement.engine_device != placement.learner_device:
        items += process_overhead(placement.engine_device, "hf engine")
    return items


def _vllm_items(
    config: TrainConfig, shape: ModelShape, placement: Placement, plans: dict[str, DevicePlan], node: Node
) -> list[str]:
    """Add what vLLM holds to each of its GPUs (:func:`vllm_need`; its KV cache is the rest of its share
    of the GPU, ``vllm.gpu_memory_utilization``); return the problems (a share too small for vLLM)."""
    vllm, problems = config.vllm, []
    tensor = placement.vllm_tensor_parallel
    need = vllm_need(config, shape, tensor)
    awake: Phase = "rollouts" if vllm.enable_sleep_mode else "always"
    fixed = [
        Item(vllm_label(config, shape, tensor), need.weights, awake),
        Item(
            f"vLLM LoRA slots ({vllm.max_loras} x rank {vllm.lora_rank_for(config.adapter_rank())})",
            need.loras,
            awake,
        ),
        Item("vLLM activations (8192 batched tokens) + CUDA graphs", need.working, awake),
        Item("vLLM CUDA context", need.context, awake),
    ]
    for index in placement.vllm_devices:
        device = device_plan(plans, node, f"cuda:{index}")
        # vLLM takes its share of the GPU's total memory; its KV cache is what the rest leaves.
        share = int(vllm.gpu_memory_utilization * device.capacity) if device.capacity else need.total
        cache = share - sum(item.bytes for item in fixed)
        sliding = (
            f", {shape.sliding_layers} layers hold {shape.sliding_window}" if shape.sliding_layers else ""
        )
        label = (
            f"vLLM KV cache, rest of its {vllm.gpu_memory_utilization:g} share (run needs "
            f"{need.kv_cache / GB:.1f} GB: {need.sequences} x {need.sequence_tokens} tokens{sliding})"
        )
        device.items += [*fixed, Item(label, max(cache, 0), awake)]
        if vllm.enable_sleep_mode:
            device.items.append(Item("vLLM asleep (its CUDA context)", CUDA_OVERHEAD_BYTES, "update"))
        if cache < need.minimum_kv:
            states = " and linear-attention states" if shape.linear_layers else ""
            raise_share = (
                "raise vllm.gpu_memory_utilization (or unset it: the plan derives it), "
                if "gpu_memory_utilization" in vllm.model_fields_set
                else ""
            )
            problems.append(
                f"vLLM's share of {device.device} ({share / GB:.1f} GB) cannot hold its weights, LoRA "
                f"slots and one {need.max_model_len}-token sequence's KV cache{states} "
                f"({need.least / GB:.1f} GB): {raise_share}set a smaller vllm.max_model_len, or raise "
                "vllm.tensor_parallel_size"
            )
    return problems


def make_plan(config: TrainConfig, shape: ModelShape, node: Node) -> Plan:
    """The memory plan of ``config`` for a model of ``shape`` on ``node`` (no choices, no advice)."""
    config = config.model_copy(update={"lora": config.lora.as_trained(config.init_adapter)})
    placement = place(config, node, shape)
    plans: dict[str, DevicePlan] = {}
    for device in placement.learner_process_devices:
        device_plan(plans, node, device).items.extend(learner_items(config, shape, placement, device))
    problems: list[str] = []
    served = None
    if config.engine == "hf" and config.ray is None:
        engine = device_plan(plans, node, placement.engine_device)
        engine.items.extend(_hf_engine_items(config, shape, placement))
    elif placement.vllm_devices:
        problems = _vllm_items(config, shape, placement, plans, node)
        served = serving_dtype(config, shape)
    parts = shards(config, placement)
    work = node_work(config, placement, node, parts > 1)
    return Plan(shape, placement, node, list(plans.values()), problems, work, served, shards=parts)


def render(plan: Plan) -> str:
    """The plan as a table per device, for people."""
    placement, node = plan.placement, plan.node
    gpus = f"{len(node.gpus)} GPU(s)" + ("" if node.present else " planned for") if node.gpus else "no GPU"
    shape = plan.shape
    active = f", {shape.active_parameters() / 1e9:.3f} B active per token" if shape.experts else ""
    active += f", and a {shape.vision_parameters / 1e9:.3f} B vision tower" if shape.vision_parameters else ""
    hybrid = (
        f": {shape.linear_layers} linear attention, {shape.full_layers} full" if shape.linear_layers else ""
    )
    lines = [
        f"model: {shape.parameters() / 1e9:.3f} B parameters{active} ({shape.layers} layers{hybrid}, hidden "
        f"{shape.hidden}, vocabulary {shape.vocab}); node: {gpus}",
        f"placement: learner on {_learner_where(plan)} ({placement.learner_dtype}), engine on "
        f"{placement.engine_device} ({plan.serving_dtype or placement.engine_dtype})"
        + (f", sharing GPU {placement.shared_gpus[0]}" if placement.shared_gpus else "")
        + (
            f"; vLLM: {placement.vllm_data_parallel} replica(s) x {placement.vllm_tensor_parallel} GPU(s)"
            if placement.vllm_devices
            else ""
        ),
    ]
    if plan.serving_dtype is not None:
        checkpoint = f" (the checkpoint's own: {shape.dtype})" if shape.dtype != plan.serving_dtype else ""
        lines.append(
            f"dtypes: the learner trains in {placement.learner_dtype}, vLLM serves in "
            f"{plan.serving_dtype}{checkpoint}"
        )
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
    lines += render_work(plan.work) if plan.work is not None else []
    # A plan that fits says what it chose; one that does not, what it tried (the closest candidate).
    said = "chosen" if plan.fits else "tried"
    return "\n".join(lines + [f"{said}: {choice}" for choice in plan.choices])


def _learner_where(plan: Plan) -> str:
    devices = plan.placement.learner_process_devices
    if len(devices) == 1 and plan.shards > 1:  # Ray's learner workers, one GPU each
        workers = f"{plan.shards} Ray learner workers"
        return f"{devices[0]} of each of {workers} (each holds a 1/{plan.shards} FSDP2 shard)"
    if len(devices) == 1:
        return devices[0]
    how = f"a 1/{plan.shards} FSDP2 shard" if plan.shards > 1 else "the whole model"
    return f"{len(devices)} processes on {', '.join(devices)} (each holds {how})"


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
