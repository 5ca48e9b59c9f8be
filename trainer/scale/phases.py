"""What each GPU of the node does in each phase of a step (sampling, update), the share of the step it is
idle, and a sentence for a GPU the layout leaves idle (``rft plan`` prints them).

The phases' lengths are estimated from FLOPs per token at one rate for every GPU: sampling 2N per token
(prefill and decode) spread over the GPUs that sample; the update 4N per token and optimizer pass
(forward and the backward through frozen weights), 2N more with gradient checkpointing, 2N for a
reference pass (``beta > 0``) and 2N for the learner's own old logprobs (importance-sampling correction
over several passes), split evenly over the learner's processes (one GPU each). Decode runs at a lower
rate per FLOP than training, so the sampling share is a lower bound. In the synchronous loop the phases
follow each other; with ``max_off_policy_steps`` > 0 they overlap."""

from __future__ import annotations

from dataclasses import dataclass

from trainer.config import TrainConfig
from trainer.scale.placement import Node, Placement

IDLE = "idle"
# Above this idle share a GPU's layout gets a sentence.
NOTABLE_IDLE = 0.25


@dataclass(frozen=True)
class GpuWork:
    """What runs on one GPU in each phase (``IDLE`` for nothing) and the share of the step it idles."""

    index: int
    sampling: str
    update: str
    idle: float


@dataclass(frozen=True)
class NodeWork:
    """Every GPU's work, the phases' estimated shares of a step, and the sentences about idle GPUs."""

    gpus: list[GpuWork]
    sampling_share: float
    update_share: float
    overlapped: bool
    notes: list[str]


def _sampling_roles(config: TrainConfig, placement: Placement) -> dict[int, str]:
    roles: dict[int, str] = {}
    tensor = placement.vllm_tensor_parallel
    for position, index in enumerate(placement.vllm_devices):
        replica = f"vLLM replica {position // tensor + 1} of {placement.vllm_data_parallel}"
        roles[index] = replica + (f" (tensor parallel {tensor})" if tensor > 1 else "")
    if config.engine == "hf" and placement.engine_device.startswith("cuda"):
        roles[int(placement.engine_device.partition(":")[2] or 0)] = "hf engine"
    return roles


def update_flops_per_token(config: TrainConfig) -> int:
    """The update's FLOPs per token in units of N (the model's parameters), as the module says."""
    per_pass = 4 + (2 if config.learner.gradient_checkpointing else 0)
    extra = (2 if config.beta > 0 else 0) + (
        2 if config.vllm_importance_sampling_correction and config.num_iterations > 1 else 0
    )
    return config.num_iterations * per_pass + extra


def node_work(
    config: TrainConfig, placement: Placement, node: Node, sharded: bool = False
) -> NodeWork | None:
    """Each GPU's work per phase (``sharded``: the learner's processes hold a shard of the model
    each); None without GPUs or with a ``ray`` section (Ray places the replicas and learner workers
    on the cluster, not on this node's plan)."""
    if not node.gpus or config.ray is not None:
        return None
    sampling_roles = _sampling_roles(config, placement)
    # An attached vLLM server samples elsewhere: count it as one GPU's worth of sampling time.
    sampling = 2 / max(len(sampling_roles), 1)
    update = float(update_flops_per_token(config))
    learners = placement.learner_gpus
    # The learner's processes split the update's micro-batches (and, sharded, the model) evenly.
    share = update / max(len(learners), 1)
    busy = {
        gpu.index: (sampling if gpu.index in sampling_roles else 0.0)
        + (share if gpu.index in learners else 0.0)
        for gpu in node.gpus
    }
    role = f"learner (FSDP2 shard of {len(learners)})" if sharded else "learner"
    overlapped = config.max_off_policy_steps > 0
    step = max([sampling, share, *busy.values()]) if overlapped else sampling + share
    gpus = [
        GpuWork(
            gpu.index,
            sampling_roles.get(gpu.index, IDLE),
            role if gpu.index in learners else _asleep(config, gpu.index, sampling_roles),
            1 - busy[gpu.index] / step,
        )
        for gpu in node.gpus
    ]
    return NodeWork(
        gpus, sampling / (sampling + share), share / (sampling + share), overlapped, _notes(config, gpus)
    )


def _asleep(config: TrainConfig, index: int, sampling_roles: dict[int, str]) -> str:
    if index in sampling_roles and config.engine == "vllm" and config.vllm.enable_sleep_mode:
        return "vLLM asleep"
    return IDLE


def _notes(config: TrainConfig, gpus: list[GpuWork]) -> list[str]:
    notes = []
    unused = [gpu.index for gpu in gpus if gpu.sampling == IDLE and not gpu.update.startswith("learner")]
    if unused:
        names = ", ".join(map(str, unused))
        notes.append(
            f"GPU {names} {'does' if len(unused) == 1 else 'do'} nothing in either phase: {_remedy(config)}."
        )
    waiting = [gpu for gpu in gpus if gpu.index not in unused and gpu.idle > NOTABLE_IDLE]
    if waiting and not config.max_off_policy_steps:
        notes.append(
            "In the synchronous loop (max_off_policy_steps: 0) the sampling GPUs wait during each update "
            "and the learner's GPU during sampling; max_off_policy_steps: 1 overlaps the two phases."
        )
    return notes


def _remedy(config: TrainConfig) -> str:
    vllm = config.vllm
    if config.engine == "hf":
        return "engine: vllm puts data-parallel vLLM replicas on every GPU the learner does not use"
    if vllm.attach_url is not None:
        return (
            "the attached vLLM server samples elsewhere; unset vllm.attach_url to let rftkit start "
            "vLLM on them"
        )
    if vllm.devices is not None or vllm.data_parallel_size is not None:
        return (
            "unset vllm.devices and vllm.data_parallel_size to give vLLM every GPU the learner does not use"
        )
    if config.learner.device == "cpu":
        return "learner.device: auto trains on a GPU of its own"
    return (
        "they are fewer than one vLLM replica needs (vllm.tensor_parallel_size); a smaller "
        "tensor-parallel size, where the model fits, or more learner processes (learner.processes) "
        "would use them"
    )


def render_work(work: NodeWork) -> list[str]:
    """The per-GPU table and the sentences, for people."""
    order = "overlapping (max_off_policy_steps > 0)" if work.overlapped else "one after the other"
    lines = [
        f"GPUs per phase (sampling ~{work.sampling_share:.0%}, update ~{work.update_share:.0%} of the "
        f"work, {order}; estimated from FLOPs at one rate, so sampling's share is a lower bound; "
        "docs/placement.md):"
    ]
    lines += [
        f"  GPU {gpu.index}: sampling: {gpu.sampling:<40} update: {gpu.update:<12} "
        f"idle {gpu.idle:4.0%} of the step"
        for gpu in work.gpus
    ]
    return lines + work.notes


def work_dict(work: NodeWork) -> dict[str, object]:
    """The per-GPU table as JSON (``rft plan --json``)."""
    return {
        "sampling_share": round(work.sampling_share, 3),
        "update_share": round(work.update_share, 3),
        "overlapped": work.overlapped,
        "gpus": [
            {"gpu": gpu.index, "sampling": gpu.sampling, "update": gpu.update, "idle": round(gpu.idle, 3)}
            for gpu in work.gpus
        ],
        "notes": work.notes,
    }
