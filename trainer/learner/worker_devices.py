"""Which device Ray's learner workers train on, decided from the cluster's resources, not from where the
driver runs: a driver on a GPU-less head node still gets GPU workers when the learners' nodes have GPUs.

``learner.device``: ``cpu`` keeps the workers on CPUs; ``cuda``/``cuda:N`` gives each worker a GPU (Ray
picks which, so the index does not matter); ``auto`` gives each a GPU when the nodes the workers may
run on (those with every resource of ``ray.learner_resources``) have GPUs, else CPUs. The dtype
follows (``learner.dtype: auto``: bfloat16 on GPUs, float32 on CPUs). Pure: the caller reads the
nodes' resources from Ray (:func:`trainer.learner.distributed.alive_node_resources`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trainer.config import TrainConfig


@dataclass(frozen=True)
class WorkerDevices:
    """Each worker's Ray ``num_gpus``, its device kind and dtype, and the sentence to log."""

    gpus_each: int  # 0 or 1
    device: str  # "cuda" or "cpu"
    dtype: str
    reason: str
    short_of_gpus: bool = False  # fewer GPUs than workers: the ones beyond wait for a GPU


def learner_node_gpus(nodes: Sequence[Mapping[str, float]], learner_resources: Mapping[str, float]) -> int:
    """GPUs on the nodes that carry every custom resource the learner workers ask for."""
    return int(
        sum(
            node.get("GPU", 0.0)
            for node in nodes
            if all(node.get(name, 0.0) >= amount for name, amount in learner_resources.items())
        )
    )


def worker_devices(config: TrainConfig, nodes: Sequence[Mapping[str, float]]) -> WorkerDevices:
    """The learner workers' devices on a cluster whose alive nodes have ``nodes``' resources."""
    settings = config.ray
    if settings is None:
        raise ValueError("learner workers need the config's ray section")
    workers, wanted = settings.learner_workers, config.learner.device
    gpus = learner_node_gpus(nodes, settings.learner_resources)
    where = "the cluster's nodes" + (
        f" with {', '.join(sorted(settings.learner_resources))}" if settings.learner_resources else ""
    )
    on_gpus = wanted.startswith("cuda") or (wanted == "auto" and gpus > 0)
    dtype = config.learner.dtype if config.learner.dtype != "auto" else "bfloat16" if on_gpus else "float32"
    if not on_gpus:
        why = "learner.device is cpu" if wanted == "cpu" else f"{where} have no GPU"
        return WorkerDevices(0, "cpu", dtype, f"{workers} learner worker(s) on CPUs in {dtype}: {why}")
    reason = f"{workers} learner worker(s) on one GPU each in {dtype}: {where} have {gpus} GPU(s)"
    if gpus >= workers:
        return WorkerDevices(1, "cuda", dtype, reason)
    return WorkerDevices(
        1,
        "cuda",
        dtype,
        f"{reason}, fewer than the workers: those beyond wait until a GPU is free (inference replicas "
        "may hold some too); lower ray.learner_workers, add GPU nodes, or set learner.device: cpu",
        short_of_gpus=True,
    )
