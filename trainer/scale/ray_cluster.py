"""The trainer's side of Ray: join or start the cluster, and build the replicated inference engine.

Imported only when the config has a ``ray`` section; Ray itself is imported inside the functions, so
``rftkit`` without the ``ray`` extra never needs it.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from policy_server.engines import Engine
from trainer.config import RayConfig, TrainConfig

log = logging.getLogger(__name__)

# Ray's override of its worker processes' niceness (RayConfig's worker_niceness, 15 by default).
WORKER_NICENESS_ENV = "RAY_worker_niceness"


@contextmanager
def ray_cluster(settings: RayConfig | None) -> Iterator[None]:
    """Connected to the cluster ``settings.address`` names for the block; nothing without settings.

    A 'local' cluster is started here and shut down after the block; a joined cluster (or a Ray
    session the caller already opened, as tests do) is left running.
    """
    if settings is None:
        yield
        return
    try:
        import ray
    except ImportError:
        raise ModuleNotFoundError(
            "the config's ray section needs Ray, which is not installed: pip install 'rftkit[ray]', "
            "or remove the ray section to train in one process"
        ) from None

    started = False
    if not ray.is_initialized():
        if settings.address == "local":
            start_local_cluster(local_num_cpus(settings))
            started = True
        else:
            ray.init(address=settings.address)
        log.info("ray cluster %s: %s", settings.address, ray.cluster_resources())
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def local_num_cpus(settings: RayConfig) -> int:
    """Logical CPUs of a 'local' cluster: the setting, else enough for every replica and learner worker
    (Ray only counts them to decide what fits; they may exceed the real cores)."""
    if settings.local_num_cpus is not None:
        return settings.local_num_cpus
    needed = (
        settings.inference_replicas * settings.replica_num_cpus
        + settings.learner_workers * settings.learner_num_cpus
    )
    return max(os.cpu_count() or 1, math.ceil(needed) + 1)


def start_local_cluster(num_cpus: int | None, **options: Any) -> None:
    """``ray.init`` of a cluster in this process, tried twice, its workers at this process's priority.

    Ray gives its raylet a fixed 30 s to register with the GCS; a machine whose cores are all busy
    can miss that window once ("The current node timed out during startup"). Ray starts its worker
    processes at niceness 15 (its ``worker_niceness``), to keep a cluster node's own daemons
    responsive; on a local cluster those workers are the run itself (the inference replicas, the
    learner workers), and at 15 any other busy process on the machine takes nearly all the cores from
    them (docs/ray.md). A niceness the user exported (``RAY_worker_niceness``) is kept.
    """
    import ray

    os.environ.setdefault(WORKER_NICENESS_ENV, "0")
    for attempt in (1, 2):
        try:
            ray.init(num_cpus=num_cpus, include_dashboard=False, **options)
            return
        except Exception as error:
            if attempt == 2 or "timed out during startup" not in str(error):
                raise
            log.warning("the local Ray cluster did not start in time (%s); trying once more", error)
            ray.shutdown()


def ray_engine(config: TrainConfig, model_dir: Path, name_prefix: str | None = None) -> Engine:
    """The inference replicas ``config.ray`` asks for, each running ``config.engine``, as one engine."""
    from policy_server.engines.ray import RayEngine

    settings = config.ray
    assert settings is not None
    num_gpus = settings.replica_num_gpus
    if num_gpus is None:
        num_gpus = float(config.vllm.tensor_parallel_size or 1) if config.engine == "vllm" else 0.0
    return RayEngine(
        functools.partial(replica_engine, config, str(model_dir)),
        model_name=Path(model_dir).name,
        replicas=settings.inference_replicas,
        num_cpus=settings.replica_num_cpus,
        num_gpus=num_gpus,
        resources=settings.replica_resources,
        max_restarts=settings.max_restarts,
        adapter_transfer=settings.adapter_transfer,
        adapter_dtype=adapter_serving_dtype(config, Path(model_dir), on_gpus=num_gpus > 0),
        recovery_timeout_s=settings.recovery_timeout_s,
        name_prefix=name_prefix,
        # A GPU vLLM's first start (compiling, capturing CUDA graphs) has its own, longer bound.
        start_timeout=(config.vllm.startup_timeout_s, "vllm.startup_timeout_s")
        if config.engine == "vllm"
        else None,
    )


def adapter_serving_dtype(config: TrainConfig, model_dir: Path, *, on_gpus: bool) -> str | None:
    """The dtype replicas serve adapters in, which they travel in; None: as the learner wrote them.

    vLLM on GPUs casts every LoRA to its --dtype ('auto': the checkpoint's own, from config.json);
    the hf engine and vLLM's CPU build serve the adapter in float32.
    """
    if config.engine != "vllm" or not on_gpus:
        return None
    if config.vllm.dtype != "auto":
        return config.vllm.dtype
    from trainer.scale.memory import ModelShape

    try:
        return ModelShape.from_model_dir(model_dir).dtype
    except (OSError, ValueError):  # ModelShapeError is a ValueError
        return None  # a model whose config.json rftkit cannot read: send what the learner wrote


def replica_engine(config: TrainConfig, model_dir: str) -> Engine:
    """Runs inside a replica actor: the engine of a one-process run, on the GPUs Ray gave the actor.

    Ray sets the actor's CUDA_VISIBLE_DEVICES, which a vLLM server started here inherits; the hf
    engine takes the first of them.
    """
    import ray

    from trainer.engine import local_engine
    from trainer.scale.placement import Placement

    on_gpu = bool(ray.get_gpu_ids())
    device = config.hf.device if config.hf.device != "auto" else ("cuda" if on_gpu else "cpu")
    hf_dtype = config.hf.dtype if config.hf.dtype != "auto" else ("bfloat16" if on_gpu else "float32")
    placement = Placement(
        learner_device="cpu",  # no learner in a replica
        learner_dtype="float32",
        engine_device=device,
        engine_dtype=config.vllm.dtype if config.engine == "vllm" else hf_dtype,
        vllm_devices=[],  # inherit the actor's CUDA_VISIBLE_DEVICES
        vllm_tensor_parallel=config.vllm.tensor_parallel_size or 1,
    )
    return local_engine(config.model_copy(update={"ray": None}), Path(model_dir), placement)
