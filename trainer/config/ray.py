"""The ray section: engine replicas and learner workers on a Ray cluster."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    field_validator,
)

from trainer.config.common import _Section


class RayConfig(_Section):
    """Scale out on Ray (the optional extra `rftkit[ray]`): inference replicas behind the one gateway and
    data-parallel learner workers, all Ray actors."""

    address: str = Field(
        default="local",
        description="The Ray cluster: 'local' starts one inside the trainer's process (ray.init); "
        "'auto' joins the cluster this node belongs to (KubeRay's head, `ray start`); "
        "'ray://host:10001' joins one through Ray Client.",
    )
    local_num_cpus: int | None = Field(
        default=None,
        gt=0,
        description="Logical CPUs of a 'local' cluster (they may exceed the real cores: a replica's "
        "num_cpus is a reservation, not a limit); unset: Ray's default, the machine's cores.",
    )
    inference_replicas: int = Field(
        default=2, gt=0, description="Inference replicas, each a Ray actor running its own engine."
    )
    replica_num_cpus: float = Field(
        default=1.0, ge=0, description="CPUs each replica actor reserves (Ray's num_cpus)."
    )
    replica_num_gpus: float | None = Field(
        default=None,
        ge=0,
        description="GPUs each replica actor reserves (Ray's num_gpus); unset: "
        "vllm.tensor_parallel_size with the vllm engine (each replica's vLLM server spans that many "
        "GPUs: tensor parallel size is vllm.tensor_parallel_size), 0 with the hf engine.",
    )
    replica_resources: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources each replica needs, to pin replicas to a node group (e.g. "
        "{inference: 1} with KubeRay's inference workers started with that resource; "
        "deploy/kuberay/raycluster.yaml).",
    )
    max_restarts: int = Field(
        default=3,
        ge=-1,
        description="How often Ray restarts a replica that died (Ray's max_restarts; -1: always). A "
        "restarted replica loads the adapter versions in use before it takes calls again.",
    )
    recovery_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="How long to wait for a dead replica to come back (model load included) before "
        "leaving it out; calls meanwhile fail over to the live replicas. Also the bound on the "
        "replicas' first start with the hf engine; with vllm that is vllm.startup_timeout_s (a GPU "
        "vLLM compiles and captures graphs first).",
    )
    adapter_transfer: Literal["object_store", "shared_path"] = Field(
        default="object_store",
        description="How adapter versions reach the replicas: 'object_store' puts the adapter's files "
        "into Ray's object store once and every replica fetches them (works across nodes without "
        "shared storage); 'shared_path' hands replicas the directory path, which every node must "
        "see (FSx, EFS). Measured in bench/adapter_transfer.py.",
    )
    learner_workers: int = Field(
        default=1,
        ge=1,
        description="Data-parallel learner workers, each a Ray actor holding the model and LoRA on one "
        "device (with learner.shard: fsdp, an FSDP2 shard of them): one GPU each when learner.device "
        "is cuda, or auto and the nodes the workers may run on (learner_resources) have GPUs, whatever "
        "the driver's node has; else CPUs. A step's micro-batches are shared out and the LoRA "
        "gradients summed across the workers (torch.distributed: NCCL on CUDA, gloo on CPU), so any "
        "count trains the same adapter as one.",
    )
    learner_num_cpus: float = Field(
        default=1.0,
        ge=0,
        description="Logical CPUs Ray reserves for each learner worker (CUDA workers also take one GPU).",
    )
    learner_resources: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources each learner worker needs, to pin workers to a node group (e.g. "
        "{learner: 1} with KubeRay's learner workers started with that resource, so a worker never takes "
        "an inference pod's GPU; deploy/kuberay/raycluster.yaml).",
    )
    learner_start_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="How long to wait for the learner workers to start (each placed on a node with the "
        "resources it asks for, and the model loaded) before the run stops with a sentence naming what "
        "they asked for and what the cluster has; Ray would leave a worker no node can hold waiting "
        "forever.",
    )
    max_learner_restarts: int = Field(
        default=3,
        ge=0,
        description="Auto-resume: how many times a run whose learner worker died restarts from its "
        "newest checkpoint (or from the start, before the first one) before it stops with an error "
        "naming the worker and how often it died.",
    )

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        if value in ("local", "auto") or value.startswith("ray://"):
            return value
        raise ValueError(f"address must be 'local', 'auto' or a ray://host:port address, got {value!r}")
