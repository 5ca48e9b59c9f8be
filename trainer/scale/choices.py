"""The settings the plan chooses so a config fits (:func:`resolve`), used by ``rft plan`` and by
``rft train`` (:func:`preflight`) alike, and the advice when none does.

A setting the user gave (pydantic's ``model_fields_set``, and a dtype other than 'auto') is never
changed. Of the others, in order: vLLM's dtype follows the learner's (``vllm.dtype: auto`` would
follow an fp16 checkpoint while the learner trains in bf16); the learner's layout (one process
first; on several GPUs, when that does not fit, 2, 4, ... processes sharding the model with FSDP2 on
GPUs of their own, vLLM on the others, then every GPU shared); within a layout the cheapest levers
first: vLLM's sleep mode on a shared GPU, gradient checkpointing, then halving the micro-batch's
tokens; only then less KV cache for vLLM. vLLM's share of its GPUs (``vllm.gpu_memory_utilization``)
is derived from what it needs (:mod:`trainer.scale.vllm_memory`) for each candidate.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trainer.config import TrainConfig
from trainer.scale.device_plan import DevicePlan
from trainer.scale.memory import DTYPE_BYTES, GB, ModelShape
from trainer.scale.placement import Node, Placement, detect_gpus, node_for, place
from trainer.scale.plan import Plan, PlanError, make_plan, render, shape_for
from trainer.scale.vllm_memory import derived_utilization, serving_dtype, vllm_need

log = logging.getLogger(__name__)
# The smallest micro-batch the plan halves down to.
FEWEST_TOKENS = 1024
# The context the advice tries for vLLM where the model's own is longer: the plan does not choose it
# (calls past it would be refused), it suggests it.
SHORTER_CONTEXT = 32768


@dataclass(frozen=True)
class Resolved:
    """The config with the plan's choices applied and its plan (whose ``choices`` say what was chosen
    and why)."""

    config: TrainConfig
    plan: Plan


def _set(section: BaseModel, name: str) -> bool:
    return name in section.model_fields_set


def changed(config: TrainConfig, changes: dict[str, Any]) -> TrainConfig:
    """``config`` with ``changes`` (dotted names) applied and validated; what the user set stays
    marked as set, the changes not (so a resolved config resolves to itself); ``config`` itself
    without changes."""
    if not changes:
        return config
    data = config.model_dump()
    for key, value in changes.items():
        node = data
        *sections, last = key.split(".")
        for section in sections:
            node = node[section]
        node[last] = value
    result = TrainConfig.model_validate(data)
    _keep_fields_set(result, config)
    return result


def _keep_fields_set(new: BaseModel, old: BaseModel) -> None:
    object.__setattr__(new, "__pydantic_fields_set__", set(old.model_fields_set))
    for name in type(old).model_fields:
        inner_new, inner_old = getattr(new, name), getattr(old, name)
        if isinstance(inner_new, BaseModel) and isinstance(inner_old, BaseModel):
            _keep_fields_set(inner_new, inner_old)


def _dtype_pair(config: TrainConfig, shape: ModelShape, node: Node) -> tuple[dict[str, Any], list[str]]:
    """Align vLLM's serving dtype and the learner's where they would differ on GPUs; refuse where
    the user set them to differ."""
    placement = place(config, node, shape)
    if not placement.vllm_devices or not placement.learner_device.startswith("cuda"):
        return {}, []
    served, learner = serving_dtype(config, shape), placement.learner_dtype
    if served == learner:
        return {}, []
    vllm_set, learner_set = config.vllm.dtype != "auto", config.learner.dtype != "auto"
    if vllm_set and learner_set:
        raise PlanError(
            f"vllm.dtype is {served} but learner.dtype is {learner}: the learner's logprobs would not "
            "match the sampler's; set both to the same dtype"
        )
    if vllm_set:
        return {"learner.dtype": served}, [f"learner.dtype: {served}, the dtype vLLM serves in (vllm.dtype)"]
    source = f"the checkpoint's {shape.dtype}, which vllm.dtype: auto would follow"
    return {"vllm.dtype": learner}, [f"vllm.dtype: {learner}, the learner's dtype, not {source}"]


def _layouts(config: TrainConfig, node: Node) -> list[dict[str, Any]]:
    """The learner's layouts to try, fewest processes first."""
    learner = config.learner
    # A device the user named is the learner's one process; Ray places its own learner workers.
    if config.ray is not None or not node.gpus or learner.device != "auto":
        return [{}]
    if _set(learner, "processes"):
        return [{"learner.shard": "off"}, {"learner.shard": "fsdp"}] if learner.shard == "auto" else [{}]
    if learner.shard == "off":
        return [{}]
    counts = [count for count in (2, 4, 8, 16) if count <= len(node.gpus)]
    sharded = [{"learner.processes": count, "learner.shard": "fsdp"} for count in counts]
    return sharded if learner.shard == "fsdp" else [{}, *sharded]


def _levers(
    config: TrainConfig, node: Node, shape: ModelShape, layout: dict[str, Any]
) -> list[dict[str, Any]]:
    """Within a layout, the levers to try, cheapest first."""
    trial = changed(config, layout)
    placement = place(trial, node, shape)
    first: list[dict[str, Any]] = [{}]
    if (
        placement.shared_gpus
        and not _set(config.vllm, "enable_sleep_mode")
        and config.max_off_policy_steps == 0
        and config.vllm.attach_url is None
    ):
        first.append({"vllm.enable_sleep_mode": True})
    if not _set(config.learner, "gradient_checkpointing"):
        first += [{**lever, "learner.gradient_checkpointing": True} for lever in first]
    levers = list(first)
    if not _set(config, "max_tokens_per_microbatch"):
        tokens = config.max_tokens_per_microbatch // 2
        while tokens >= FEWEST_TOKENS:
            levers.append({**first[-1], "max_tokens_per_microbatch": tokens})
            tokens //= 2
    return levers


# The share of the KV cache the run's rollouts would fill that a derived vLLM share tries, most
# first (beyond one max_model_len sequence, which vLLM always needs), each after every lever: less
# KV cache serves fewer rollouts at once, so vLLM queues the others.
KV_FRACTIONS = (1.0, 0.5, 0.25, 0.0)


def _with_share(
    config: TrainConfig, shape: ModelShape, node: Node, kv_fraction: float = 1.0
) -> tuple[TrainConfig, list[str]]:
    """``config`` with vLLM's share derived from what it needs, unless the user set it."""
    vllm = config.vllm
    if _set(vllm, "gpu_memory_utilization") or config.engine != "vllm":
        return config, []
    placement = place(config, node, shape)
    memory = [node.gpus[index].memory_bytes for index in placement.vllm_devices if index < len(node.gpus)]
    known = [size for size in memory if size is not None]
    if not known:
        return config, []
    need = vllm_need(config, shape, placement.vllm_tensor_parallel)
    share = derived_utilization(need, min(known), kv_fraction)
    # On GPUs of its own, memory vLLM leaves goes unused: it takes at least its default share, the
    # rest as more KV cache (more rollouts decoded at once).
    own = not placement.shared_gpus and share < vllm.gpu_memory_utilization
    share = vllm.gpu_memory_utilization if own else share
    kv = max(share * min(known) - need.least + need.minimum_kv, 0)
    reason = (
        f"vllm.gpu_memory_utilization: {share:g}, "
        + ("vLLM's default, its GPUs being its own; it needs " if own else "what vLLM needs ")
        + f"on each of its GPUs of {min(known) / GB:.0f} GB: weights {need.weights / GB:.1f} GB, LoRA "
        f"slots, activations, CUDA graphs and context, and {kv / GB:.1f} GB of KV cache (its "
        f"{need.sequences} rollouts of {need.sequence_tokens} tokens would fill {need.kv_cache / GB:.1f} GB)"
    )
    return changed(config, {"vllm.gpu_memory_utilization": share}), [reason]


def resolve(config: TrainConfig, shape: ModelShape, node: Node) -> Resolved:
    """The config with the first choices (in the module's order) that make it fit, and its plan with
    the reasons; where none does, the candidate that comes closest (the least memory over its
    devices' capacity), whose plan says by how much."""
    pair, reasons = _dtype_pair(config, shape, node)
    base = changed(config, pair) if pair else config
    closest: tuple[float, Resolved] | None = None
    for layout in _layouts(base, node):
        # Every lever before less KV cache: fewer rollouts decoded at once costs more than they do.
        for fraction in KV_FRACTIONS:
            for levers in _levers(base, node, shape, layout):
                trial, share = _with_share(changed(base, {**layout, **levers}), shape, node, fraction)
                plan = make_plan(trial, shape, node)
                plan.choices = reasons + _said(base, plan, {**layout, **levers}) + share
                if plan.fits:
                    return Resolved(trial, plan)
                if closest is None or _overflow(plan) < closest[0]:
                    closest = (_overflow(plan), Resolved(trial, plan))
    assert closest is not None  # every config has at least its own layout and no lever
    return closest[1]


def _overflow(plan: Plan) -> float:
    """How far a plan is from fitting: the bytes its devices' peaks exceed their memory by, a problem
    (a vLLM share too small) counting as a GPU's worth."""
    over = sum(max(d.peak[0] - d.capacity, 0) for d in plan.devices if d.capacity is not None)
    return over + len(plan.problems) * max((d.capacity or 0 for d in plan.devices), default=0)


def _said(config: TrainConfig, plan: Plan, changes: dict[str, Any]) -> list[str]:
    """A sentence per chosen lever: what it is and why."""
    why = {
        "vllm.enable_sleep_mode": "the learner and vLLM share a GPU: asleep during the update, vLLM "
        "hands the learner its weights' and KV cache's memory",
        "learner.gradient_checkpointing": "without it the update's activations do not fit beside the rest",
        "max_tokens_per_microbatch": f"{config.max_tokens_per_microbatch} tokens' activations do not fit",
    }
    said = [f"{key}: {json.dumps(value)} ({why[key]})" for key, value in changes.items() if key in why]
    if changes.get("learner.shard") == "fsdp":
        keys = [key for key in ("learner.processes", "learner.shard") if key in changes]
        chosen = " and ".join(f"{key}: {changes[key]}" for key in keys)
        devices = ", ".join(plan.placement.learner_process_devices)
        dtype = plan.placement.learner_dtype
        weights = (plan.shape.parameters() + plan.shape.vision_parameters) * DTYPE_BYTES[dtype]
        reason = (
            f"the learner's {dtype} weights, {weights / GB:.1f} GB, do not fit one GPU beside the update"
            if config.learner.shard == "auto"
            else "learner.shard: fsdp is set"
        )
        said.append(
            f"{chosen} ({reason}: sharded with FSDP2 over {devices}, "
            f"each holds 1/{plan.shards} of them and of the LoRA state, one decoder layer gathered at a time)"
        )
    return said


def advice(config: TrainConfig, plan: Plan) -> str:
    """Why a resolved config does not fit and what to change: a sentence per problem."""
    device = next((device for device in plan.devices if not device.fits), None)
    sentences = [_device_advice(config, plan, device)] if device is not None else []
    return " ".join(sentences + plan.problems)


def _user_levers(config: TrainConfig, plan: Plan) -> list[dict[str, Any]]:
    """Changes the plan does not choose itself, one at a time: to what the user set, and a shorter
    context for vLLM."""
    levers: list[dict[str, Any]] = []
    free = [gpu.index for gpu in plan.node.gpus if gpu.index not in plan.placement.vllm_devices]
    if plan.placement.shared_gpus and free and _set(config.learner, "device"):
        levers.append({"learner.device": f"cuda:{free[0]}"})
    if _set(config.learner, "gradient_checkpointing") and not config.learner.gradient_checkpointing:
        levers.append({"learner.gradient_checkpointing": True})
    if plan.placement.learner_dtype == "float32" and plan.placement.learner_device.startswith("cuda"):
        levers.append({"learner.dtype": "bfloat16"})
    if (
        plan.placement.shared_gpus
        and _set(config.vllm, "enable_sleep_mode")
        and not config.vllm.enable_sleep_mode
    ):
        levers.append({"vllm.enable_sleep_mode": True})
    if (
        config.engine == "vllm"
        and config.vllm.max_model_len is None
        and plan.shape.max_positions > SHORTER_CONTEXT
    ):
        # vLLM holds one sequence of the model's own context at least; the run's calls may need less.
        levers.append({"vllm.max_model_len": SHORTER_CONTEXT})
    if _set(config, "max_tokens_per_microbatch"):
        levers += [{"max_tokens_per_microbatch": config.max_tokens_per_microbatch // 2**n} for n in (1, 2, 3)]
    if _set(config.vllm, "gpu_memory_utilization") and plan.placement.shared_gpus:
        share = config.vllm.gpu_memory_utilization - 0.05
        while share > 0.04:
            levers.append({"vllm.gpu_memory_utilization": round(share, 2)})
            share -= 0.05
    return levers


def _device_advice(config: TrainConfig, plan: Plan, device: DevicePlan) -> str:
    """Why ``device`` overflows and the first checked change to a user's setting that makes it fit."""
    peak, phase = device.peak
    assert device.capacity is not None
    head = (
        f"{device.device} needs about {peak / GB:.1f} GB at its peak (during the {phase}) but has "
        f"{device.capacity / GB:.1f} GB"
    )
    for changes in _user_levers(config, plan):
        trial = resolve(changed(config, changes), plan.shape, plan.node).plan
        if trial.fits:
            setting = " and ".join(f"{key}={json.dumps(value)}" for key, value in changes.items())
            largest = max(trial.devices, key=lambda d: d.peak[0])
            return (
                f"{head}; it fits with {setting} (then the largest peak is {largest.peak[0] / GB:.1f} GB, "
                f"on {largest.device})."
            )
    weights = (plan.shape.parameters() + plan.shape.vision_parameters) * DTYPE_BYTES[
        plan.placement.learner_dtype
    ]
    other_gpu = "" if config.ray is not None else " put vLLM on another GPU (vllm.devices),"
    return (
        f"{head}, and no setting rftkit can change makes it fit (the learner's weights alone take "
        f"{weights / GB:.1f} GB in {plan.placement.learner_dtype}): use a GPU with more memory or more GPUs,"
        f"{other_gpu} or choose a smaller model."
    )


def check(config: TrainConfig, shape: ModelShape, node: Node) -> Plan:
    """The plan of the resolved config, or :class:`PlanError` with a sentence that says what to change."""
    resolved = resolve(config, shape, node)
    if not resolved.plan.fits:
        raise PlanError(f"this config does not fit: {advice(resolved.config, resolved.plan)}")
    return resolved.plan


def preflight(config: TrainConfig, model_dir: str | Path) -> tuple[TrainConfig, Placement]:
    """What ``rft train`` runs first: the config with the plan's choices applied (:func:`resolve`,
    logged with their reasons) and its placement, after checking it fits (:class:`PlanError`)."""
    node = node_for(config, detect_gpus())
    try:
        shape: ModelShape | None = shape_for(model_dir)
    except PlanError:
        shape = None  # a hub id the engine resolves itself: nothing to estimate from
    resolved = resolve(config, shape, node) if shape is not None else None
    config = resolved.config if resolved is not None else config
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
    if resolved is None:
        log.info("no memory plan: %s is not a local model directory", model_dir)
        return config, placement
    if not resolved.plan.fits:
        raise PlanError(f"this config does not fit: {advice(resolved.config, resolved.plan)}")
    log.info("memory plan:\n%s", render(resolved.plan))
    return config, resolved.plan.placement
