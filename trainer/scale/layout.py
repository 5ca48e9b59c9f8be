"""How vLLM fills a node's GPUs: its replicas' tensor-parallel size, how many data-parallel replicas, and
on which GPUs, chosen from the model's size and the node (:func:`vllm_layout`).

The learner keeps a GPU of its own for each of its processes (``learner.processes``, one unless the plan
shards the learner: :mod:`trainer.scale.choices`) when the node has more, and vLLM takes the others: one
server with ``--data-parallel-size`` replicas of ``--tensor-parallel-size`` GPUs each. The tensor-
parallel size is the smallest of 1, 2, 4, 8 whose share of each GPU holds what vLLM needs
(:func:`vllm_needs`). A setting the user gave (``vllm.devices``, ``vllm.tensor_parallel_size``,
``vllm.data_parallel_size``, ``learner.device``) is kept as given."""

from __future__ import annotations

from dataclasses import dataclass

from trainer.config import TrainConfig
from trainer.scale.memory import ModelShape
from trainer.scale.vllm_memory import MOST_SHARE, vllm_need

# Tensor-parallel sizes tried, smallest first (vLLM needs one that divides the attention heads).
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class VllmLayout:
    """vLLM's GPUs: ``data_parallel`` replicas of ``tensor_parallel`` GPUs each, on ``devices``."""

    devices: list[int]
    tensor_parallel: int = 1
    data_parallel: int = 1


def vllm_needs(config: TrainConfig, shape: ModelShape, tensor_parallel: int) -> int:
    """Bytes vLLM needs on each of its GPUs at least: its weights, LoRA slots, working memory and one
    ``max_model_len`` sequence's KV cache, what vLLM itself checks at start (:func:`vllm_need`); more
    KV cache serves more rollouts at once."""
    return vllm_need(config, shape, tensor_parallel).least


def fitting_tensor_parallel(
    config: TrainConfig, shape: ModelShape | None, gpu_bytes: int | None, gpus: int
) -> int:
    """The smallest tensor-parallel size (at most ``gpus``) whose share of a ``gpu_bytes`` GPU holds
    the model; the largest tried when none does (the memory plan then says so); 1 when the model's
    size or the GPU's memory is unknown."""
    if shape is None or gpu_bytes is None:
        return 1
    sizes = [size for size in TENSOR_PARALLEL_SIZES if size <= max(gpus, 1) and shape.heads % size == 0]
    set_share = "gpu_memory_utilization" in config.vllm.model_fields_set
    share = (config.vllm.gpu_memory_utilization if set_share else MOST_SHARE) * gpu_bytes
    for size in sizes:
        if vllm_needs(config, shape, size) <= share:
            return size
    return sizes[-1]


def vllm_layout(
    config: TrainConfig, gpus: list[int], gpu_bytes: int | None, shape: ModelShape | None
) -> VllmLayout:
    """vLLM's GPUs on a node with GPUs ``gpus`` (each of ``gpu_bytes``), for a model of ``shape``.

    Without ``vllm.devices``: the GPUs the learner does not take, where ``learner.device: auto``
    keeps the last GPUs for the learner's processes when the others hold at least one replica; with
    fewer GPUs vLLM shares the learner's.
    """
    vllm = config.vllm
    if vllm.devices is not None:
        tensor = vllm.tensor_parallel_size or len(vllm.devices) // (vllm.data_parallel_size or 1)
        if vllm.tensor_parallel_size is None and vllm.data_parallel_size is None:
            tensor = fitting_tensor_parallel(config, shape, gpu_bytes, len(vllm.devices))
            tensor = tensor if len(vllm.devices) % tensor == 0 else 1
        return VllmLayout(list(vllm.devices), tensor, len(vllm.devices) // tensor)
    learner = config.learner.device
    named = int(learner.partition(":")[2] or 0) if learner.startswith("cuda") else None
    pool = [gpu for gpu in gpus if gpu != named]
    processes = config.learner.processes or 1
    if learner == "auto" and len(gpus) > processes:
        pool = pool[:-processes]  # the learner's own GPUs
    tensor = vllm.tensor_parallel_size or fitting_tensor_parallel(config, shape, gpu_bytes, len(gpus))
    if len(pool) < tensor * (vllm.data_parallel_size or 1):
        pool = list(gpus)  # too few GPUs of its own: vLLM shares the learner's
    replicas = vllm.data_parallel_size or max(len(pool) // tensor, 1)
    return VllmLayout(pool[: tensor * replicas], tensor, replicas)
