"""Placement on one node: which GPU the learner gets, which ones vLLM gets, and in which dtypes.

Rules, in order: vLLM (when rftkit starts it) gets ``vllm.devices``, else every GPU the learner
does not keep, as data-parallel replicas of a tensor-parallel size that holds the model
(:mod:`trainer.scale.layout`). The learner gets ``learner.device``; ``auto`` is the first GPU vLLM
was not given, else vLLM's first GPU (shared: vLLM takes ``gpu_memory_utilization`` of it, the
learner the rest), else the CPU. The hf engine runs in the learner's process, on the learner's
device unless ``hf.device`` says otherwise. ``auto`` dtypes are bfloat16 on CUDA, float32 on CPU.
With a ``ray`` section the engines run in replica actors, each on the GPUs Ray gives it
(``trainer.scale.ray_cluster``), so this node's plan holds the learner alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from trainer.config import TrainConfig
from trainer.scale.layout import VllmLayout, vllm_layout
from trainer.scale.memory import ModelShape

GB = 1e9
# The engine's place with a `ray` section: replica actors, on GPUs of their own.
RAY_REPLICAS = "ray replicas"


class PlacementError(ValueError):
    """A placement that names GPUs this node does not have (the message says which)."""


@dataclass(frozen=True)
class Gpu:
    """One GPU of the node; ``memory_bytes`` is None when neither torch nor the config says."""

    index: int
    memory_bytes: int | None
    name: str = "GPU"


@dataclass(frozen=True)
class Node:
    """The GPUs planned for and whether they are really present (seen by torch)."""

    gpus: list[Gpu]
    present: bool


@dataclass(frozen=True)
class Placement:
    """Where each part of a run goes."""

    learner_device: str  # "cpu" or "cuda:N"
    learner_dtype: str
    engine_device: str  # hf's device; "cuda:a,b" for vLLM's GPUs, "cpu" without; RAY_REPLICAS with Ray
    engine_dtype: str
    vllm_devices: list[int]
    vllm_tensor_parallel: int = 1  # GPUs each vLLM replica spans
    vllm_data_parallel: int = 1  # vLLM replicas (--data-parallel-size) over vllm_devices
    # One device per learner process (learner.processes); empty: one process on learner_device.
    learner_devices: tuple[str, ...] = ()

    @property
    def learner_process_devices(self) -> tuple[str, ...]:
        """The device of each learner process, rank order (rank 0 on ``learner_device``)."""
        return self.learner_devices or (self.learner_device,)

    @property
    def learner_gpu(self) -> int | None:
        return _index(self.learner_device)

    @property
    def learner_gpus(self) -> list[int]:
        """The GPUs of the learner's processes."""
        return [index for index in map(_index, self.learner_process_devices) if index is not None]

    @property
    def shared_gpus(self) -> list[int]:
        """GPUs both vLLM and the learner use."""
        return [gpu for gpu in self.vllm_devices if gpu in self.learner_gpus]


def _index(device: str) -> int | None:
    if not device.startswith("cuda"):
        return None
    return int(device.partition(":")[2] or 0)


def detect_gpus() -> list[Gpu]:
    """The CUDA devices torch sees (none without a CUDA build of torch or without a GPU)."""
    import torch

    if not torch.cuda.is_available():
        return []
    gpus = []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        gpus.append(Gpu(index, int(properties.total_memory), properties.name))
    return gpus


def node_for(config: TrainConfig, detected: list[Gpu]) -> Node:
    """The node to plan for: the detected GPUs, with ``placement``'s declarations winning."""
    declared = config.placement
    count = declared.num_gpus if declared.num_gpus is not None else len(detected)
    if count == 0 and declared.num_gpus is None:
        # No GPU here, none declared, but the config names some: plan for the GPUs it names.
        count = _gpus_named(config)
    gpus = []
    for index in range(count):
        seen = detected[index] if index < len(detected) else None
        memory = int(declared.gpu_memory_gb * GB) if declared.gpu_memory_gb else None
        if memory is None and seen is not None:
            memory = seen.memory_bytes
        gpus.append(Gpu(index, memory, seen.name if seen else "declared GPU"))
    return Node(gpus=gpus, present=bool(detected))


def _gpus_named(config: TrainConfig) -> int:
    if config.ray is not None:  # the engines run in replica actors, on GPUs Ray gives them
        index = _index(config.learner.device)
        return 0 if index is None else index + 1
    named = [_index(device) for device in (config.learner.device, config.hf.device)]
    indices = [index for index in named if index is not None]
    if config.engine == "vllm" and config.vllm.attach_url is None and indices:
        vllm = config.vllm
        indices += vllm.devices or list(
            range((vllm.tensor_parallel_size or 1) * (vllm.data_parallel_size or 1))
        )
    elif config.engine == "vllm" and config.vllm.devices:
        indices += config.vllm.devices
    return max(indices) + 1 if indices else 0


def _vllm(config: TrainConfig, node: Node, shape: ModelShape | None) -> VllmLayout:
    if config.ray is not None and config.vllm.data_parallel_size is not None:
        raise PlacementError(
            "vllm.data_parallel_size with a ray section: on Ray the replicas are ray.inference_replicas "
            "actors, each with its own GPUs; unset vllm.data_parallel_size"
        )
    if config.engine != "vllm" or config.vllm.attach_url is not None or config.ray is not None:
        return VllmLayout([])
    if not node.gpus and config.vllm.devices is None:
        return VllmLayout([])
    memory = [gpu.memory_bytes for gpu in node.gpus if gpu.memory_bytes is not None]
    layout = vllm_layout(config, [gpu.index for gpu in node.gpus], min(memory, default=None), shape)
    wanted = layout.tensor_parallel * layout.data_parallel
    if node.gpus and len(layout.devices) < wanted:
        raise PlacementError(
            f"vLLM needs {wanted} GPU(s) (vllm.tensor_parallel_size x vllm.data_parallel_size) but the "
            f"node has {len(node.gpus)}: lower vllm.tensor_parallel_size or vllm.data_parallel_size"
        )
    return layout


def place(config: TrainConfig, node: Node, shape: ModelShape | None = None) -> Placement:
    """Resolve every ``auto`` of ``config`` on ``node`` for a model of ``shape`` (unknown: vLLM's
    tensor-parallel size defaults to 1); raises :class:`PlacementError`."""
    layout = _vllm(config, node, shape)
    vllm = layout.devices
    learner, learner_devices = _learner(config, node, vllm)
    engine = config.hf.device if config.hf.device != "auto" else learner
    if engine == "cuda":
        engine = "cuda:0"
    named = [_index(learner), _index(engine), *map(_index, learner_devices)]
    if config.ray is not None:
        # This node runs the learner's plan only: each replica actor places its own engine.
        engine = RAY_REPLICAS
        del named[1]
    elif config.engine == "vllm":
        engine = "cuda:" + ",".join(map(str, vllm)) if vllm else "cpu"
        del named[1]
    used = {index for index in named if index is not None} | set(vllm)
    known = {gpu.index for gpu in node.gpus}
    if node.gpus and not used <= known:
        missing = sorted(used - known)
        raise PlacementError(
            f"the config places work on GPU {missing[0]}, but the node has {len(node.gpus)} GPU(s) "
            f"(0 to {len(node.gpus) - 1}): fix learner.device, hf.device or vllm.devices"
        )
    return Placement(
        learner_device=learner,
        learner_dtype=_dtype(config.learner.dtype, learner),
        engine_device=engine,
        engine_dtype=config.vllm.dtype if config.engine == "vllm" else _dtype(config.hf.dtype, engine),
        vllm_devices=vllm,
        vllm_tensor_parallel=layout.tensor_parallel,
        vllm_data_parallel=layout.data_parallel,
        learner_devices=learner_devices,
    )


def _learner(config: TrainConfig, node: Node, vllm: list[int]) -> tuple[str, tuple[str, ...]]:
    """The learner's device and, with several processes (``learner.processes``; on Ray, Ray places
    the learner workers), each one's: the GPUs vLLM was not given first, then vLLM's (shared)."""
    processes = (config.learner.processes or 1) if config.ray is None else 1
    learner = "cuda:0" if config.learner.device == "cuda" else config.learner.device
    if learner == "auto":
        pool = [gpu.index for gpu in node.gpus if gpu.index not in vllm] + vllm
        indices = pool[:processes]
    else:
        first = _index(learner)
        indices = [] if first is None else list(range(first, first + processes))
    if node.gpus and indices and len(indices) < processes:
        raise PlacementError(
            f"learner.processes is {processes} but the node has {len(node.gpus)} GPU(s): lower "
            "learner.processes (one GPU each)"
        )
    if not indices:
        device = "cpu" if learner == "auto" else learner
        return device, (device,) * processes if processes > 1 else ()
    devices = tuple(f"cuda:{index}" for index in indices)
    return devices[0], devices if processes > 1 else ()


def _dtype(name: str, device: str) -> str:
    if name != "auto":
        return name
    return "bfloat16" if device.startswith("cuda") else "float32"


def cuda_visible_devices(indices: list[int], inherited: str | None = None) -> str:
    """CUDA_VISIBLE_DEVICES for a child process that should see GPUs ``indices`` of this process.

    When this process itself runs under CUDA_VISIBLE_DEVICES, its GPU i is the i-th entry there.
    """
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES") if inherited is None else inherited
    visible = [entry.strip() for entry in inherited.split(",")] if inherited else None
    if visible is None:
        return ",".join(str(index) for index in indices)
    if any(index >= len(visible) for index in indices):
        raise PlacementError(
            f"GPU {max(indices)} is not among this process's CUDA_VISIBLE_DEVICES={inherited}"
        )
    return ",".join(visible[index] for index in indices)
