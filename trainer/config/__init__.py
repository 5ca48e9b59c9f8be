"""The training configuration: one validated object read from YAML or TOML, with CLI overrides.

Names follow TRL's ``GRPOConfig`` wherever the concept exists there (``num_generations``, ``beta``,
``epsilon``, ``loss_type``, ``learning_rate``, ...), so a TRL user reads this file without a guide.
``python -m trainer.config --markdown`` renders the reference page ``docs/config.md`` from the field
descriptions below.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
import tomllib
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticUndefined

from handlers.agent_client import RUNTIME_ARN_FORM, is_runtime_arn
from policy_server.images import (
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_IMAGES_PER_CALL,
    ImageLimits,
)

# The validation context key that carries the directory relative paths are resolved against.
BASE_DIR_KEY = "base_dir"


RewardAggregation = Literal["sum", "last", "mean"]
# TRL's vllm_importance_sampling_mode values (trainer.algo.grpo implements them; config stays torch-free).
ImportanceSamplingMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


class ConfigError(ValueError):
    """A configuration that cannot be loaded; the message names each bad field and why."""


def _resolve_path(value: Path, info: ValidationInfo) -> Path:
    base = (info.context or {}).get(BASE_DIR_KEY)
    if base is None or value.is_absolute():
        return value
    return (Path(base) / value).resolve()


# A filesystem path; relative ones are taken from the config file's directory.
ConfigPath = Annotated[Path, AfterValidator(_resolve_path)]

TorchDtype = Literal["auto", "float32", "bfloat16", "float16"]
# A torch device: "auto", "cpu", "cuda" or "cuda:N".
_DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def _device_name(value: str) -> str:
    if not _DEVICE_PATTERN.match(value):
        raise ValueError(f"{value!r} is not a device: use auto, cpu, cuda or cuda:N")
    return value


DeviceName = Annotated[str, AfterValidator(_device_name)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class LoraConfig(_Section):
    """The LoRA adapter that training updates (peft's names)."""

    r: int = Field(default=16, gt=0, description="Adapter rank.")
    lora_alpha: float = Field(
        default=32.0, gt=0, description="Scaling numerator: updates scale by alpha / r."
    )
    lora_dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout on the adapter's input.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        default="all-linear",
        description="Module names to adapt (e.g. [q_proj, v_proj]), or 'all-linear' for every linear "
        "layer except the output head. In a vision-language model, of the parts adapt_vision names.",
    )
    adapt_vision: Literal["none", "projector", "all"] = Field(
        default="none",
        description="Vision-language models: what LoRA adapts besides the language model. 'none': "
        "the vision tower and its projector stay frozen; 'projector': the projector (Qwen2-VL's "
        "visual.merger) too; 'all': the whole vision tower too. Ignored for text-only models.",
    )

    @field_validator("target_modules")
    @classmethod
    def _non_empty(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, list) and not value:
            raise ValueError("list at least one module name, or use 'all-linear'")
        return value


class HFEngineConfig(_Section):
    """Settings of the in-process hf engine (transformers + peft)."""

    max_batch_size: int = Field(
        default=64, gt=0, description="Most chat calls decoded together in one batch."
    )
    device: DeviceName = Field(
        default="auto", description="Torch device of the engine; 'auto': the learner's device."
    )
    dtype: TorchDtype = Field(
        default="auto",
        description="dtype of the engine's copy of the model: 'auto' is bfloat16 on CUDA, float32 "
        "on CPU (where sampler and learner logprobs then agree to about 1e-6).",
    )

    batch_invariant: bool = Field(
        default=True,
        description="Compute each row of a batch independently of the other rows (attention over "
        "the row's own keys, matrix products padded to full BLAS tiles), so a seeded call samples "
        "the same tokens whichever calls share its batch and a run repeats exactly however its "
        "agents are timed (on CPU; CUDA kernels are not covered). False is faster: about 0.7x the "
        "tokens per second at 1 to 8 concurrent calls on the tiny model (bench/hf_engine.py).",
    )


class LearnerConfig(_Section):
    """Where and how the learner (the trained model) runs."""

    device: DeviceName = Field(
        default="auto",
        description="Torch device of the learner: 'auto' (the first CUDA device the placement gives "
        "it, else CPU), 'cpu', 'cuda' or 'cuda:N'.",
    )
    dtype: TorchDtype = Field(
        default="auto",
        description="dtype the base model is loaded in (transformers' dtype): 'auto' is bfloat16 on "
        "CUDA and float32 on CPU. The LoRA parameters and their AdamW state stay float32 whatever "
        "this says (peft's autocast_adapter_dtype).",
    )
    gradient_checkpointing: bool = Field(
        default=False,
        description="Recompute each decoder layer's activations in the backward pass instead of "
        "keeping them (transformers' name): activation memory falls from every layer's to about one "
        "layer's, for about a third more compute.",
    )
    logits_chunk_size: int = Field(
        default=1024,
        gt=0,
        description="Completion tokens per output-head chunk when computing token logprobs: the "
        "[tokens, vocabulary] float32 logits exist one chunk at a time (and are recomputed in the "
        "backward pass), never for the whole micro-batch.",
    )


class PlacementConfig(_Section):
    """Which GPUs of this node exist for planning; `rft plan` checks the memory of each."""

    num_gpus: int | None = Field(
        default=None,
        ge=0,
        description="GPUs to plan for; unset: the CUDA devices torch sees. Declare it to plan for a "
        "machine other than this one.",
    )
    gpu_memory_gb: float | None = Field(
        default=None,
        gt=0,
        description="Memory of each GPU in GB (10^9 bytes); unset: what torch reports. A declared "
        "value wins, e.g. to keep room for another process.",
    )


class VLLMConfig(_Section):
    """Settings of the vllm engine: a vLLM OpenAI server in its own process."""

    python: ConfigPath | None = Field(
        default=None,
        description="Python interpreter of the environment where vLLM is installed; unset: "
        "$RFTKIT_VLLM_PYTHON, else the interpreter running rftkit.",
    )
    attach_url: str | None = Field(
        default=None,
        description="Base URL of an already running vLLM server to use instead of starting one. It "
        "must run with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 (checked at start); the "
        "name it serves is read from its /v1/models.",
    )
    dtype: str = Field(
        default="auto",
        description="vLLM's --dtype: 'auto' (the model's own), 'float32' (exact logprobs on CPU), "
        "'bfloat16', 'float16'.",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="Extra command-line arguments for the vLLM server (e.g. [--max-num-seqs, 128]).",
    )
    devices: list[int] | None = Field(
        default=None,
        description="GPU indices vLLM gets (its CUDA_VISIBLE_DEVICES), as many as "
        "tensor_parallel_size; unset: the first ones. A GPU listed here and also given to the "
        "learner is shared: vLLM takes gpu_memory_utilization of it, the learner the rest.",
    )
    tensor_parallel_size: int = Field(
        default=1, gt=0, description="vLLM's --tensor-parallel-size: GPUs one vLLM server spans."
    )
    gpu_memory_utilization: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="vLLM's --gpu-memory-utilization: the share of each of its GPUs vLLM takes "
        "(weights + KV cache). When the learner shares the GPU, leave it room (e.g. 0.3 to 0.5).",
    )
    max_model_len: int | None = Field(
        default=None,
        gt=0,
        description="vLLM's --max-model-len: the longest context (prompt + completion) of one call; "
        "unset: the model's own.",
    )
    enable_sleep_mode: bool = Field(
        default=False,
        description="vLLM's --enable-sleep-mode (CUDA only): during each update vLLM sleeps "
        "(POST /sleep, level sleep_level) so the learner can use the memory of its KV cache, then "
        "wakes (POST /wake_up) before the new adapter is loaded.",
    )
    sleep_level: Literal[1, 2] = Field(
        default=1,
        description="vLLM's sleep level: 1 offloads the weights to CPU memory and drops the KV "
        "cache; 2 also drops the weights (vLLM must then reload them itself).",
    )
    max_lora_rank: int = Field(
        default=64, gt=0, description="vLLM's --max-lora-rank; must be at least lora.r."
    )
    max_loras: int = Field(
        default=2, gt=0, description="vLLM's --max-loras: adapter versions resident at once (old + new)."
    )
    startup_timeout_s: float = Field(
        default=600.0, gt=0, description="Seconds to wait for a started vLLM server to answer /health."
    )
    # --- tool calls and reasoning (vLLM's own parser names)
    tool_call_parser: str | None = Field(
        default="hermes",
        description="vLLM's --tool-call-parser, with --enable-auto-tool-choice: 'hermes' (Qwen, and "
        "the chatml-tools template), 'llama3_json' (Llama 3.x), 'openai' (gpt-oss), or any parser "
        "your vLLM lists; null: tool calls stay in the text.",
    )
    reasoning_parser: str | None = Field(
        default=None,
        description="vLLM's --reasoning-parser: 'qwen3', 'openai_gptoss', or any parser your vLLM "
        "lists; the reasoning comes back as reasoning_content and its tokens stay in the recorded "
        "completion. null: no parser.",
    )

    @field_validator("attach_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value.rstrip("/") if value else value

    @model_validator(mode="after")
    def _devices_match_tensor_parallel(self) -> VLLMConfig:
        if self.devices is not None and len(self.devices) != self.tensor_parallel_size:
            raise ValueError(
                f"devices lists {len(self.devices)} GPU(s) but tensor_parallel_size is "
                f"{self.tensor_parallel_size}: give vLLM exactly tensor_parallel_size GPUs"
            )
        if self.devices is not None and (
            len(set(self.devices)) != len(self.devices) or min(self.devices) < 0
        ):
            raise ValueError(f"devices must be distinct GPU indices >= 0, got {self.devices}")
        return self


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
        "leaving it out; calls meanwhile fail over to the live replicas.",
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
        "device (one GPU each on CUDA): a step's micro-batches are shared out and the LoRA gradients "
        "all-reduced (torch.distributed: NCCL on CUDA, gloo on CPU), so any count trains the same "
        "adapter as one.",
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


class PolicyServerConfig(_Section):
    """Where the policy server (the OpenAI-compatible endpoint agents call) listens."""

    host: str = Field(default="127.0.0.1", description="Interface to bind; 0.0.0.0 to serve other machines.")
    port: int = Field(default=0, ge=0, le=65535, description="Port to bind; 0 picks a free one.")
    public_url: str | None = Field(
        default=None,
        description="Endpoint URL sent to agents when they reach the server by another address "
        "(a tunnel, a load balancer); unset: http://host:port.",
    )
    api_key: str | None = Field(
        default=None,
        description="Bearer key agents must send on the routes they call (/v1, feedback, /health); "
        "it is handed to every agent and opens no admin operation. Unset: no authentication.",
    )
    accept_sagemaker_tokens: bool = Field(
        default=False,
        description="Also accept, on the agents' routes, the bearer tokens AWS's SageMaker SDK "
        "(sagemaker-train) signs and sends in place of any key: checked offline for form, credential "
        "scope and expiry, not for their signature (see the README).",
    )
    sagemaker_access_key_ids: list[str] = Field(
        default_factory=list,
        description="With accept_sagemaker_tokens: the AWS access key ids a token may name; empty: any.",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Port of Prometheus' /metrics (the policy server's and the trainer's step series), "
        "on the same host, apart from the port agents call; 0 picks a free one; unset: no metrics.",
    )
    max_image_bytes: int = Field(
        default=DEFAULT_MAX_IMAGE_BYTES,
        gt=0,
        description="Largest image file an agent may send (bytes after base64 decoding, per image); "
        "a larger one is refused with a 400.",
    )
    max_images_per_call: int = Field(
        default=DEFAULT_MAX_IMAGES_PER_CALL,
        gt=0,
        description="Most images one chat call may carry, counted over its whole conversation (a "
        "multi-turn episode re-sends earlier images); vLLM's per-prompt image limit too.",
    )
    max_image_pixels: int = Field(
        default=DEFAULT_MAX_IMAGE_PIXELS,
        gt=0,
        description="Most pixels (width x height) an image may have, checked before it is decoded; "
        "the model's image processor then resizes what it takes.",
    )

    def image_limits(self) -> ImageLimits:
        """The ``max_image*`` settings, as the gateway takes them."""
        return ImageLimits(self.max_image_bytes, self.max_images_per_call, self.max_image_pixels)

    gateway_workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Gateway processes serving the agents' port (vllm engine only): 1 serves it from "
        "the trainer's process; more start that many worker processes sharing the port, the job state "
        "staying in the trainer's process (docs/architecture.md). Each worker uses up to one core; "
        "the cost per call is in bench/results/gateway_cpu.json and gateway_overhead.json.",
    )

    @field_validator("public_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value.rstrip("/") if value else value


class TokenPrices(_Section):
    """Dollars per million tokens in the SageMaker cost model's three buckets (defaults: its demo)."""

    prefill: float = Field(default=0.12, ge=0, description="Price per million prompt (prefill) tokens.")
    sample: float = Field(default=0.30, ge=0, description="Price per million sampled tokens.")
    train: float = Field(default=0.36, ge=0, description="Price per million trained tokens.")


class TrainConfig(_Section):
    """Everything ``rft train`` needs. TRL's ``GRPOConfig`` names wherever the concept exists there."""

    # --- model and engine
    model: str | None = Field(
        default=None,
        description="Base model: a local directory in transformers format (relative to the config "
        "file when it exists there) or a hub id the engine can load; unset: a tiny model built "
        "offline in the run directory (demos and tests).",
    )
    init_adapter: ConfigPath | None = Field(
        default=None,
        description="peft LoRA adapter directory to start from (e.g. written by `rft sft`); it is "
        "served as adapter version 1 and trained further. Unset: a fresh adapter (B = 0, so the "
        "policy starts as the base model).",
    )
    chat_template: str | None = Field(
        default=None,
        description="Chat template replacing the model's own, for both engines (vLLM's "
        "--chat-template) and `rft sft`: a shipped template's name ('chatml-tools': ChatML with hermes "
        "tool calls, for models whose template has no tool section, such as SmolLM2) or a Jinja file "
        "(relative to the config file). Unset: the model's own template.",
    )
    engine: Literal["hf", "vllm"] = Field(
        default="hf",
        description="Inference engine: 'hf' (transformers in process, CPU or GPU) or 'vllm' (a vLLM "
        "server process).",
    )
    hf: HFEngineConfig = Field(default_factory=HFEngineConfig, description="Settings of the hf engine.")
    vllm: VLLMConfig = Field(default_factory=VLLMConfig, description="Settings of the vllm engine.")
    ray: RayConfig | None = Field(
        default=None,
        description="Run on a Ray cluster: inference replicas and learner workers as Ray actors; unset: "
        "one engine and the learner in this process (Ray never imported).",
    )
    policy_server: PolicyServerConfig = Field(
        default_factory=PolicyServerConfig, description="Where the policy endpoint listens."
    )
    policy_name: str = Field(
        default="policy", min_length=1, description="Model name the policy endpoint serves the adapter as."
    )
    lora: LoraConfig = Field(default_factory=LoraConfig, description="The LoRA adapter.")
    learner: LearnerConfig = Field(
        default_factory=LearnerConfig, description="The learner's device, dtype and memory savers."
    )
    placement: PlacementConfig = Field(
        default_factory=PlacementConfig, description="The GPUs of this node, for the memory plan."
    )

    # --- data and agents
    train_file: ConfigPath = Field(
        default=Path("train.jsonl"),
        description="Training rows, JSONL; each row (or its prompt_column) is sent as the payload's prompt.",
    )
    prompt_column: str | None = Field(
        default="prompt",
        min_length=1,
        description="The row field sent as the payload's prompt, as SageMaker's service sends only the "
        "row's `prompt` column (a string, often JSON): a row that is an object holding this field "
        "sends that field's value as it is; any other row is sent whole. null: every row is sent whole. "
        "A name other than `prompt` that no row holds is an error.",
    )
    eval_file: ConfigPath | None = Field(
        default=None, description="Validation rows, JSONL; unset: no evaluation."
    )
    shuffle: bool = Field(default=True, description="Shuffle the training rows every epoch (with seed).")
    agents: list[str] = Field(
        default_factory=lambda: ["http://127.0.0.1:8080"],
        min_length=1,
        description="Agent targets: http(s) base URLs (POST {url}/invocations; several are balanced by "
        "outstanding requests) and/or AgentCore runtime ARNs (invoke_agent_runtime).",
    )
    agent_qualifier: str | None = Field(
        default=None, description="AgentCore endpoint qualifier for ARN targets; unset: DEFAULT."
    )
    aws_region: str | None = Field(
        default=None, description="Region for AgentCore calls; unset: the region in each ARN."
    )
    rollout_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="Deadline of one rollout, retries included; past it the rollout counts as a timeout.",
    )
    max_concurrent_rollouts: int = Field(
        default=64, gt=0, description="Rollouts in flight at once across all agent targets."
    )
    max_retries: int = Field(
        default=3,
        ge=0,
        description="Retries of a rollout after a transport failure (refused, reset, closed, 429, 502, "
        "503, 504), with exponential backoff and jitter, while the deadline allows.",
    )
    retry_backoff_s: float = Field(
        default=0.5, gt=0, description="First retry delay; it doubles on every retry (plus jitter)."
    )
    reward_aggregation: RewardAggregation = Field(
        default="sum",
        description="How a per-turn reward list becomes the episode reward: sum, last or mean.",
    )

    # --- GRPO
    num_generations: int = Field(default=8, ge=2, description="Rollouts per row (the group size G).")
    rows_per_step: int = Field(default=8, gt=0, description="Dataset rows per training step.")
    max_steps: int = Field(default=100, gt=0, description="Training steps.")
    num_iterations: int = Field(
        default=1,
        ge=1,
        description="Optimizer steps on each step's batch (mu in the GRPO paper; TRL's default 1). Above "
        "1, later passes are off-policy and the clipped ratio against an old policy fixed for the "
        "whole batch keeps them close (the sampler's logprobs, or with "
        "vllm_importance_sampling_correction the learner's own before the first pass, as TRL); the "
        "learning-rate schedule counts optimizer steps (max_steps x num_iterations).",
    )
    loss_type: Literal["grpo", "dr_grpo", "dapo"] = Field(
        default="dapo",
        description="'grpo': token mean per episode (all of a rollout's calls), then mean over "
        "episodes; 'dr_grpo': token sum over a constant (episodes x max_completion_length); 'dapo': "
        "mean over all tokens of the batch.",
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        default="group",
        description="Divide advantages by the reward std of the group, of the batch, or not at all "
        "(true/false mean group/none).",
    )
    beta: float = Field(
        default=0.0,
        ge=0,
        description="KL coefficient against the reference policy: init_adapter when set (the warm "
        "start), else the base model (adapter disabled); 0 skips the KL pass.",
    )
    epsilon: float = Field(default=0.2, gt=0, description="Lower clip range of the importance ratio.")
    epsilon_high: float | None = Field(
        default=None, gt=0, description="Upper clip range; unset: epsilon (DAPO uses 0.28)."
    )
    use_bias_correction_kl: bool = Field(
        default=False,
        description="With beta > 0, multiply each token's k3 KL term by the importance ratio of the "
        "clipped objective (current over old policy), as DeepSeek-V3.2 does; TRL's option of the same "
        "name, and its default (false).",
    )
    vllm_importance_sampling_correction: bool = Field(
        default=False,
        description="Correct the sampler/learner mismatch as TRL does (either engine, despite TRL's "
        "name): the learner's logprobs of a step's batch are computed once, before its first "
        "optimizer pass, and are the old policy of the clipped ratio for all num_iterations passes; "
        "each token's loss is weighted by the sampler-to-learner ratio exp(learner - sampler), bounded "
        "as vllm_importance_sampling_mode says. false (rftkit's default; TRL's is true): the old "
        "policy is the sampler's recorded logprobs, so the clipped ratio itself absorbs the mismatch "
        "and no extra forward pass is made.",
    )
    vllm_importance_sampling_mode: ImportanceSamplingMode = Field(
        default="token_truncate",
        description="How the sampler-to-learner ratio becomes a weight, TRL's modes: token_truncate "
        "(per token, capped at the cap: truncated importance sampling), token_mask (per token, 0 "
        "above the cap), sequence_truncate / sequence_mask (one ratio per training sequence, a "
        "rollout's calls merged where each prompt extends the last: the product of its tokens'). "
        "token_truncate is what TRL's docs call the default; TRL's field default is sequence_mask.",
    )
    vllm_importance_sampling_cap: float = Field(
        default=3.0,
        gt=0,
        description="The cap C of vllm_importance_sampling_mode (TRL's default, 3.0).",
    )
    max_off_policy_steps: int = Field(
        default=0,
        ge=0,
        description="Asynchronous training: how many adapter versions a rollout may lag the policy "
        "it trains (verl's staleness threshold, slime's/AReaL's max off-policy steps; TRL has no "
        "equivalent). 0: synchronous, each step samples with the adapter of the step before. k >= 1: "
        "while the learner trains step s, the rollouts of steps s+1..s+k are played; the rollouts of "
        "step s start once step s-1-k is trained and all sample on that adapter (pacing by step, so a "
        "seeded run repeats exactly). Each rollout ends on the version it began with; the clipped "
        "ratio against the sampler's recorded logprobs (or the sampler-to-learner weight, with "
        "vllm_importance_sampling_correction) corrects the lag; no finished rollout is discarded. "
        "Metrics: staleness/mean and staleness/max per step. With the vllm engine, max_loras must "
        "hold k + 2 adapters.",
    )

    # --- optimizer and schedule
    learning_rate: float = Field(default=2e-5, gt=0, description="Peak learning rate (AdamW).")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    adam_beta1: float = Field(default=0.9, ge=0, lt=1, description="AdamW beta1.")
    adam_beta2: float = Field(default=0.999, ge=0, lt=1, description="AdamW beta2.")
    adam_epsilon: float = Field(default=1e-8, gt=0, description="AdamW epsilon.")
    lr_scheduler_type: Literal["constant", "constant_with_warmup", "linear", "cosine"] = Field(
        default="constant", description="Learning-rate schedule over max_steps."
    )
    warmup_steps: int = Field(default=0, ge=0, description="Linear warm-up steps.")
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradient clipping norm.")
    max_tokens_per_microbatch: int = Field(
        default=8192,
        gt=0,
        description="Token budget of one forward/backward pass; a step's sequences are packed into "
        "micro-batches under it and their gradients accumulated.",
    )

    # --- sampling
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature of training rollouts.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling of training rollouts.")
    max_completion_length: int = Field(
        default=512, gt=0, description="Most tokens one model call may sample (maxTokens)."
    )
    max_calls_per_rollout: int = Field(
        default=64, gt=0, description="Most model calls one rollout may make; later calls answer 4xx."
    )
    seed: int = Field(default=0, description="Seed of data order, sampling and initialisation.")

    # --- evaluation
    eval_steps: int | None = Field(
        default=10, gt=0, description="Evaluate every N steps; unset: only at start and end."
    )
    eval_on_start: bool = Field(default=True, description="Evaluate before the first step.")
    eval_on_end: bool = Field(default=True, description="Evaluate after the last step.")
    eval_temperature: float = Field(
        default=0.0, ge=0, description="Sampling temperature of evaluation rollouts (0: greedy)."
    )
    eval_generations: int = Field(
        default=1,
        gt=0,
        description="Evaluation rollouts per validation row; more make a sampled evaluation "
        "(eval_temperature > 0) less noisy. Each gets the same seed at every evaluation.",
    )
    success_threshold: float = Field(
        default=0.0, description="An evaluation rollout succeeds when its reward is above this."
    )
    max_eval_rows: int | None = Field(
        default=None, gt=0, description="Evaluate on the first N validation rows; unset: all."
    )

    # --- run directory, checkpoints, tracking
    output_dir: ConfigPath = Field(
        default=Path("runs/rftkit"),
        description="Run directory: metrics, adapters, checkpoints, MLflow store, results.",
    )
    save_steps: int = Field(default=10, gt=0, description="Checkpoint every N steps (and after the last).")
    save_total_limit: int = Field(default=3, gt=0, description="Checkpoints kept; older ones are deleted.")
    mlflow_tracking_uri: str | None = Field(
        default=None,
        description="MLflow tracking URI (a server or a store path); unset: a local file store in "
        "output_dir/mlruns.",
    )
    mlflow_experiment_name: str = Field(default="rftkit", min_length=1, description="MLflow experiment.")
    run_name: str | None = Field(default=None, description="MLflow run name; unset: output_dir's name.")
    prices: TokenPrices = Field(
        default_factory=TokenPrices, description="Token prices per million for the cost estimate."
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "truncated_importance_cap" in data:
            raise ValueError(
                "truncated_importance_cap is now TRL's vllm_importance_sampling_cap: set "
                "vllm_importance_sampling_correction: true and vllm_importance_sampling_cap: "
                f"{data['truncated_importance_cap']} (mode token_truncate, the default)"
            )
        return data

    @field_validator("scale_rewards", mode="before")
    @classmethod
    def _scale_rewards_bool(cls, value: Any) -> Any:
        # TRL accepted booleans before it grew the "group"/"batch"/"none" choices.
        if isinstance(value, bool):
            return "group" if value else "none"
        return value

    @field_validator("agents")
    @classmethod
    def _agent_targets(cls, targets: list[str]) -> list[str]:
        for target in targets:
            if not (target.startswith(("http://", "https://")) or is_runtime_arn(target)):
                raise ValueError(
                    f"{target!r} is neither an http(s) URL nor an AgentCore runtime ARN ({RUNTIME_ARN_FORM})"
                )
        return [t.rstrip("/") if t.startswith("http") else t for t in targets]

    @field_validator("model")
    @classmethod
    def _model_path(cls, value: str | None, info: ValidationInfo) -> str | None:
        base = (info.context or {}).get(BASE_DIR_KEY)
        if value is None or base is None or Path(value).is_absolute():
            return value
        local = Path(base) / value
        return str(local.resolve()) if local.exists() or value.startswith(".") else value

    @field_validator("chat_template")
    @classmethod
    def _chat_template(cls, value: str | None, info: ValidationInfo) -> str | None:
        from policy_server.chat_templates import SHIPPED, chat_template_path

        if value is None or value in SHIPPED:
            return value
        base = (info.context or {}).get(BASE_DIR_KEY)
        path = Path(value).expanduser()
        if base is not None and not path.is_absolute():
            path = Path(base) / path
        return str(chat_template_path(path))  # raises ChatTemplateError (a ValueError) if unreadable

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.epsilon_high is not None and self.epsilon_high < self.epsilon:
            raise ValueError(f"epsilon_high ({self.epsilon_high}) must be at least epsilon ({self.epsilon})")
        if self.engine == "vllm" and self.vllm.max_lora_rank < self.lora.r:
            raise ValueError(
                f"vllm.max_lora_rank ({self.vllm.max_lora_rank}) must be at least lora.r ({self.lora.r})"
            )
        if self.ray is not None and self.engine == "vllm" and self.vllm.attach_url is not None:
            raise ValueError(
                "ray with vllm.attach_url: Ray replicas start their own vLLM servers; unset attach_url"
            )
        if self.ray is not None and self.vllm.enable_sleep_mode:
            raise ValueError(
                "ray with vllm.enable_sleep_mode: Ray replicas hold their own GPUs, so there is no "
                "learner to hand memory to; unset enable_sleep_mode"
            )
        if self.ray is not None and self.vllm.devices is not None:
            raise ValueError("ray with vllm.devices: Ray assigns each replica its GPUs; unset devices")
        if self.policy_server.gateway_workers > 1 and self.engine != "vllm":
            raise ValueError(
                "policy_server.gateway_workers > 1 needs engine: vllm (the workers attach to its server); "
                "the hf engine runs in the trainer's process, so it is served by one gateway worker"
            )
        if self.policy_server.gateway_workers > 1 and self.ray is not None:
            raise ValueError(
                "policy_server.gateway_workers > 1 with a ray section: gateway workers attach to one vLLM "
                "server, not to Ray replicas; set gateway_workers: 1"
            )
        if self.warmup_steps > self.max_steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) exceeds max_steps ({self.max_steps})")
        if self.engine == "vllm" and self.vllm.max_loras < self.max_off_policy_steps + 2:
            # The versions in flight (up to k), the newest one and the one being replaced.
            raise ValueError(
                f"max_off_policy_steps {self.max_off_policy_steps} keeps up to "
                f"{self.max_off_policy_steps + 2} adapter versions loaded in vLLM; set vllm.max_loras to "
                f"at least {self.max_off_policy_steps + 2} (it is {self.vllm.max_loras})"
            )
        return self

    @property
    def clip_high(self) -> float:
        """The upper clip range actually used (epsilon_high, else epsilon)."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @property
    def mlflow_uri(self) -> str:
        """The tracking URI to use: the configured one, else a file store in the run directory."""
        return self.mlflow_tracking_uri or (self.output_dir / "mlruns").resolve().as_uri()


# ---------------------------------------------------------------------------------------------------
# Loading


def load_config(path: str | Path, overrides: list[str] | None = None) -> TrainConfig:
    """Read a ``.yaml``/``.yml``/``.toml`` file, apply ``key.sub=value`` overrides, validate.

    Override values are parsed as YAML scalars (``lora.r=8``, ``agents=[http://a, http://b]``).
    Relative paths are resolved against the config file's directory. Raises :class:`ConfigError`.
    """
    path = Path(path)
    data = _read_file(path)
    for override in overrides or []:
        _apply_override(data, override)
    return validate_config(data, base_dir=path.resolve().parent)


def validate_config(data: dict[str, Any], base_dir: Path | None = None) -> TrainConfig:
    """Validate a mapping into a :class:`TrainConfig`; relative paths resolve against ``base_dir``."""
    context = {BASE_DIR_KEY: base_dir} if base_dir is not None else None
    try:
        return TrainConfig.model_validate(data, context=context)
    except ValidationError as error:
        raise ConfigError(_describe(error)) from None


def _read_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        elif suffix == ".toml":
            data = tomllib.loads(text)
        else:
            raise ConfigError(f"config file {path} must end in .yaml, .yml or .toml")
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"config file {path} is not valid {suffix[1:].upper()}: {error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of fields, not {type(data).__name__}")
    return data


def _apply_override(data: dict[str, Any], override: str) -> None:
    key, sep, raw = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {override!r} must look like key=value (e.g. lora.r=8)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as error:
        raise ConfigError(f"override {override!r}: the value is not a YAML scalar or list: {error}") from None
    parts = key.split(".")
    node = data
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {override!r}: {'.'.join(parts[: depth + 1])} is not a section")
        node = child
    node[parts[-1]] = value


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        location = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message += _suggestion(item["loc"])
        lines.append(f"{location}: {message}" if location else message)
    noun = "problem" if len(lines) == 1 else "problems"
    return f"invalid training config ({len(lines)} {noun}):\n" + "\n".join(f"  {line}" for line in lines)


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The section a field holds (``Section`` or an optional ``Section | None``), else None."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        annotation = members[0] if len(members) == 1 else None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _suggestion(location: tuple[int | str, ...]) -> str:
    model: type[BaseModel] = TrainConfig
    for part in location[:-1]:
        section = _section_model(model.model_fields[str(part)].annotation)
        if section is None:
            return ""
        model = section
    close = difflib.get_close_matches(str(location[-1]), list(model.model_fields), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ---------------------------------------------------------------------------------------------------
# Reference page


# The command line docs/config.md shows; tests/trainer/test_config_docs.py runs it through `rft train`.
EXAMPLE_COMMAND = "rft train run.yaml --set lora.r=8 --set agents='[http://a:8080, http://b:8080]'"


def render_markdown() -> str:
    """The reference page for every field: type, default, description, one table per section."""
    out = [
        "# Training configuration reference",
        "",
        "<!-- Generated by `python -m trainer.config --markdown > docs/config.md`; do not edit. -->",
        "",
        "`rft train CONFIG` reads a YAML (`.yaml`, `.yml`) or TOML (`.toml`) file into "
        "`trainer.config.TrainConfig`. Unknown fields are errors. Relative paths are resolved against "
        "the config file's directory. Override any field on the command line with `--set`, dotted keys "
        "for sections, values parsed as YAML: "
        f"`{EXAMPLE_COMMAND}`.",
        "",
        "Names follow TRL's `GRPOConfig` where the concept exists there.",
        "",
    ]
    out += _section_table("Top level", TrainConfig, "")
    for name, field in TrainConfig.model_fields.items():
        section = _section_model(field.annotation)
        if section is not None:
            out += _section_table(f"`{name}`: {section.__doc__ or ''}".strip(), section, f"{name}.")
    return "\n".join(out).rstrip() + "\n"


def _section_table(title: str, model: type[BaseModel], prefix: str) -> list[str]:
    rows = [f"## {title}", "", "| field | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if _section_model(annotation) is not None:
            continue
        description = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{prefix}{name}` | {_type_name(annotation)} | {_default(field)} | {description} |")
    return rows + [""]


def _default(field: Any) -> str:
    value = field.default_factory() if field.default_factory is not None else field.default
    if value is PydanticUndefined:
        return "required"
    if value is None:
        return "unset"
    if isinstance(value, Path):
        value = str(value)
    return f"`{json.dumps(value)}`"


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Annotated:
        return _type_name(args[0])
    if origin is Literal:
        return " \\| ".join(f"`{arg}`" for arg in args)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(arg) for arg in args if arg is not type(None)]
        return " \\| ".join(names) + (" (optional)" if type(None) in args else "")
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if annotation is Path:
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer.config --markdown``: print the reference page."""
    args = sys.argv[1:] if argv is None else argv
    if args != ["--markdown"]:
        print("usage: python -m trainer.config --markdown > docs/config.md", file=sys.stderr)
        return 2
    sys.stdout.write(render_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
