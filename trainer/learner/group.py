"""The learner's process group: how many learner processes, on which devices, sharded or not, and
joining them in one ``torch.distributed`` group (NCCL on GPUs, gloo on CPU) whose collectives give
up after ``learner.collective_timeout_s`` instead of waiting for a dead or hung rank forever."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

import torch

from trainer.errors import TrainingError

if TYPE_CHECKING:
    from trainer.config import TrainConfig
    from trainer.scale.placement import Placement


def learner_processes(config: TrainConfig) -> int:
    """Learner processes on this node without Ray (``learner.processes``; unset: one)."""
    return config.learner.processes or 1


def shards_learner(config: TrainConfig) -> bool:
    """Whether the learner's ranks shard the model with FSDP2 (``learner.shard``).

    ``auto`` is resolved before the learner starts: the run's plan (``trainer.scale.choices``) sets
    ``fsdp`` where the model does not fit one device beside its update; one it leaves ``auto`` keeps
    the whole model on every rank.
    """
    return config.learner.shard == "fsdp"


def uses_process_group(config: TrainConfig) -> bool:
    """Whether the run's learner (without Ray) is a group of learner processes rather than one
    learner in the trainer's own process: several processes, or sharding asked for (a world of one
    still runs the sharded path)."""
    return config.ray is None and (learner_processes(config) > 1 or shards_learner(config))


def process_devices(config: TrainConfig, placement: Placement) -> tuple[str, ...]:
    """The device of each learner process, rank order: on the CPU every rank's is ``cpu``; on GPUs
    the placement's learner devices, one each (:class:`TrainingError` when there are too few)."""
    wanted = learner_processes(config)
    if torch.device(placement.learner_device).type != "cuda":
        return ("cpu",) * wanted
    devices = placement.learner_process_devices
    if len(devices) < wanted:
        raise TrainingError(
            f"learner.processes is {wanted} but the placement gives the learner {len(devices)} GPU(s) "
            f"({', '.join(devices)}): set learner.processes to {len(devices)} or fewer, or give the "
            "learner more GPUs"
        )
    return devices[:wanted]


def join_group(device: torch.device, init_method: str, rank: int, world: int, timeout_s: float) -> None:
    """Join the learner's process group as ``rank`` of ``world`` (NCCL on a CUDA device, else gloo)."""
    import torch.distributed as dist

    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
