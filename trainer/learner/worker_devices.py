"""Which device Ray's learner workers train on, decided from the cluster's resources, not from where the
driver runs: a driver on a GPU-less head node still gets GPU workers when the learners' nodes have GPUs.

``learner.device``: ``cpu`` keeps the workers on CPUs; ``cuda``/``cuda:N`` gives each worker a GPU (Ray
picks which, so the index does not matter); ``auto`` gives each a GPU when the nodes the workers may
run on (those with every resource of ``ray.learner_resources``) have GPUs, else CPUs. The dtype
follows (``learner.dtype: auto``: bfloat16 on GPUs, float32 on CPUs). Pure: the caller reads the
nodes' resources from Ray (:func:`trainer.learner.distributed.alive_node_resources`); except
:func:`wait_for_workers`, the bounded wait for the workers to start, which says what they asked for
and what the cluster has when they did not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainer.config import TrainConfig
from trainer.errors import TrainingError


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


def start_timeout_message(
    config: TrainConfig, chosen: WorkerDevices, nodes: Sequence[Mapping[str, float]], waiting: int
) -> str:
    """The sentence when ``waiting`` of the learner workers did not start in time: what each asked
    for, what the cluster's alive ``nodes`` have, and what to change."""
    from policy_server.engines.ray import asked_and_had

    settings = config.ray
    assert settings is not None
    workers = settings.learner_workers
    asked = {"CPU": settings.learner_num_cpus, "GPU": float(chosen.gpus_each), **settings.learner_resources}
    asked = {name: amount for name, amount in asked.items() if amount > 0}
    totals = {name: sum(node.get(name, 0.0) for node in nodes) for name in asked}
    each, has = asked_and_had(asked, totals)
    room = sum(
        int(min((node.get(name, 0.0) / amount for name, amount in asked.items()), default=workers))
        for node in nodes
    )
    said = (
        f"the Ray learner's {workers} worker(s) did not all start within "
        f"{settings.learner_start_timeout_s:g} s (ray.learner_start_timeout_s): {waiting} still waiting. "
        f"Each asks for {each}; the cluster's alive nodes have {has} in all, room for {room} such worker(s)"
    )
    if room < workers:
        cpu = ", or set learner.device: cpu" if chosen.gpus_each else ""
        return f"{said}: lower ray.learner_workers or add nodes with those resources{cpu}"
    return (
        f"{said}: other actors (inference replicas) may hold them (`ray status` shows what is free), or "
        "loading the model takes longer: raise ray.learner_start_timeout_s"
    )


def wait_for_workers(
    workers: list[Any],
    config: TrainConfig,
    chosen: WorkerDevices,
    nodes: Callable[[], list[dict[str, float]]],
) -> None:
    """Wait up to ``ray.learner_start_timeout_s`` for the learner workers (Ray actor handles) to start:
    Ray leaves an actor whose resources no node has pending forever. Past it, stop them all and raise
    :class:`TrainingError` with :func:`start_timeout_message` (``nodes()``: the alive nodes' resources
    then). A constructor that raised counts as started: the first call shows its error."""
    import ray

    assert config.ray is not None
    started = [worker.__ray_ready__.remote() for worker in workers]
    _, pending = ray.wait(started, num_returns=len(started), timeout=config.ray.learner_start_timeout_s)
    if pending:
        for worker in workers:
            ray.kill(worker, no_restart=True)
        raise TrainingError(start_timeout_message(config, chosen, nodes(), len(pending)))
