"""The whole training configuration, ``TrainConfig``: top-level fields and the sections. Names follow
TRL's ``GRPOConfig`` wherever the concept exists there (``num_generations``, ``beta``, ``epsilon``, ...)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from handlers import RUNTIME_ARN_FORM, is_runtime_arn
from trainer.config.common import (
    BASE_DIR_KEY,
    ConfigPath,
    ImportanceSamplingMode,
    ReasoningEffort,
    RewardAggregation,
    _Section,
)
from trainer.config.distillation import DISTILLATION_FIELD, DistillationConfig
from trainer.config.engines import HFEngineConfig, VLLMConfig
from trainer.config.faults import FaultsConfig
from trainer.config.fidelity import FidelityConfig, TranscriptsConfig
from trainer.config.learner import LearnerConfig
from trainer.config.lora import LoraConfig
from trainer.config.objective import EpsilonHighField, LossTypeField, check_objective
from trainer.config.placement import PlacementConfig
from trainer.config.prices import TokenPrices
from trainer.config.ray import RayConfig
from trainer.config.server import PolicyServerConfig


class TrainConfig(_Section):
    """Everything ``rft train`` needs. TRL's ``GRPOConfig`` names wherever the concept exists there."""

    # --- model and engine
    model: str | None = Field(
        default=None,
        description="Base model: a local directory in transformers format (relative to the config "
        "file when it exists there; never a hub id: rftkit downloads nothing); unset: a tiny model "
        "built offline in the run directory (demos and tests).",
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
        description="Inference engine: 'hf' (transformers in process, CPU or GPU) or 'vllm' (a vLLM server).",
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
        "503, 504), with exponential backoff and jitter, while the deadline allows; also of each call "
        "to a distillation teacher endpoint (a timeout counts as such a failure there).",
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
    loss_type: LossTypeField = "dapo"
    scale_rewards: Literal["group", "batch", "none"] = Field(
        default="group",
        description="Divide advantages by the reward std of the group, of the batch, or not at all "
        "(true/false mean group/none).",
    )
    beta: float = Field(
        default=0.0,
        ge=0,
        description="KL coefficient against the reference policy: init_adapter when set (the warm "
        "start), else the base model (adapter disabled); 0 skips the KL pass, which otherwise runs once "
        "per batch, its num_iterations passes sharing it (as TRL's).",
    )
    distillation: DistillationConfig | None = Field(default=None, description=DISTILLATION_FIELD)
    epsilon: float = Field(default=0.2, gt=0, description="Lower clip range of the importance ratio.")
    epsilon_high: EpsilonHighField = None
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
        description="Asynchronous training: how many adapter versions a rollout may lag the policy it trains "
        "(verl's staleness threshold, slime's/AReaL's max off-policy steps; TRL has no equivalent). 0: "
        "synchronous, each step samples with the adapter of the step before. k >= 1: while the learner "
        "trains step s, the rollouts of steps s+1..s+k are played; the rollouts of step s start once step "
        "s-1-k is trained and all sample on that adapter (pacing by step, so a seeded run repeats exactly). "
        "Each rollout ends on the version it began with; the clipped ratio against the sampler's recorded "
        "logprobs (or the sampler-to-learner weight, with vllm_importance_sampling_correction) corrects the "
        "lag; no finished rollout is discarded. Metrics: staleness/mean and staleness/max per step. With the "
        "vllm engine, max_loras must hold k + 2 adapters.",
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
        description="Token budget of one forward/backward pass (sequences packed under it, gradients "
        "accumulated). Unset: the plan halves it, down to 1024, where the run does not fit otherwise.",
    )

    # --- sampling
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature of training rollouts.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling of training rollouts.")
    max_completion_length: int = Field(
        default=512, gt=0, description="Most tokens one model call may sample (maxTokens)."
    )
    reasoning_effort: ReasoningEffort = None
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
    faults: FaultsConfig = Field(default_factory=FaultsConfig, description="SIGTERM: preemption.")
    mlflow_tracking_uri: str | None = Field(
        default=None,
        description="MLflow tracking URI (a server or a store path); unset: a local file store in "
        "output_dir/mlruns; 'none': no MLflow (the steps still go to output_dir/metrics.jsonl).",
    )
    mlflow_experiment_name: str = Field(default="rftkit", min_length=1, description="MLflow experiment.")
    run_name: str | None = Field(default=None, description="MLflow run name; unset: output_dir's name.")
    prices: TokenPrices = Field(
        default_factory=TokenPrices, description="Token prices per million for the cost estimate."
    )
    fidelity: FidelityConfig = Field(default_factory=FidelityConfig, description=FidelityConfig.__doc__)
    transcripts: TranscriptsConfig = Field(default_factory=TranscriptsConfig, description="Episodes kept.")

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
        from policy_server.models import SHIPPED, chat_template_path

        if value is None or value in SHIPPED:
            return value
        base = (info.context or {}).get(BASE_DIR_KEY)
        path = Path(value).expanduser()
        if base is not None and not path.is_absolute():
            path = Path(base) / path
        return str(chat_template_path(path))  # raises ChatTemplateError (a ValueError) if unreadable

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        check_objective(self.loss_type, self.epsilon, self.epsilon_high)
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
        return self

    @model_validator(mode="after")
    def _vllm_consistent(self) -> TrainConfig:
        vllm = self.vllm
        self.lora.check_served_by(self.engine)
        if self.engine == "vllm" and vllm.max_lora_rank is not None and vllm.max_lora_rank < self.lora.r:
            raise ValueError(
                f"vllm.max_lora_rank ({vllm.max_lora_rank}) must be at least lora.r ({self.lora.r})"
            )
        if self.ray is not None and self.engine == "vllm" and vllm.attach_url is not None:
            raise ValueError(
                "ray with vllm.attach_url: Ray replicas start their own vLLM servers; unset attach_url"
            )
        if self.ray is not None and vllm.enable_sleep_mode:
            raise ValueError(
                "ray with vllm.enable_sleep_mode: Ray replicas hold their own GPUs, so there is no "
                "learner to hand memory to; unset enable_sleep_mode"
            )
        if vllm.enable_sleep_mode and vllm.sleep_level != 1:
            raise ValueError(
                f"vllm.sleep_level {vllm.sleep_level}: vLLM drops the weights at level 2 and wakes "
                "without them, and rftkit does not reload them (the base model never changes, so "
                "level 1, weights kept in CPU memory, loses nothing); set sleep_level: 1"
            )
        if vllm.enable_sleep_mode and self.max_off_policy_steps > 0:
            raise ValueError(
                f"vllm.enable_sleep_mode with max_off_policy_steps {self.max_off_policy_steps}: vLLM "
                "would sleep during each update while later steps' rollouts are still sampling from "
                "it; unset enable_sleep_mode or set max_off_policy_steps: 0"
            )
        if self.engine == "vllm" and vllm.max_loras < self.max_off_policy_steps + 2:
            # The versions in flight (up to k), the newest one and the one being replaced.
            raise ValueError(
                f"max_off_policy_steps {self.max_off_policy_steps} keeps up to "
                f"{self.max_off_policy_steps + 2} adapter versions loaded in vLLM; set vllm.max_loras to "
                f"at least {self.max_off_policy_steps + 2} (it is {vllm.max_loras})"
            )
        return self

    def adapter_rank(self) -> int:
        """The trained adapter's rank: init_adapter's (its shape wins over ``lora``), else lora.r."""
        return self.lora.rank_with(self.init_adapter)

    @property
    def mlflow_uri(self) -> str:
        """The tracking URI to use: the configured one, else a file store in the run directory."""
        return self.mlflow_tracking_uri or (self.output_dir / "mlruns").resolve().as_uri()
