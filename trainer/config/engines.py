"""The engine sections: ``hf`` (in-process transformers) and ``vllm`` (a vLLM server)."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from handlers import http_url
from trainer.config.common import ConfigPath, DeviceName, TorchDtype, _Section

# The ranks vLLM's --max-lora-rank accepts.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


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

    batch_invariant: bool | None = Field(
        default=None,
        description="Compute each row of a batch independently of the other rows (attention over "
        "the row's own keys, matrix products padded to full BLAS tiles), so a seeded call samples "
        "the same tokens whichever calls share its batch and a run repeats exactly however its "
        "agents are timed. False is faster (docs/benchmarks.md). Unset: on for an engine on the "
        "CPU, off on CUDA, where it buys no invariance (cuBLAS picks kernels by shape) and costs an "
        "attention call per row per layer.",
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
        "must run with --enable-lora, VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 and raw logprobs "
        "(--logprobs-mode raw_logprobs, vLLM's default) (checked at start); the name it serves is "
        "read from its /v1/models.",
    )
    dtype: str = Field(
        default="auto",
        description="vLLM's --dtype: 'auto' (on GPUs the learner's dtype, where the model's own "
        "would differ from it, else the model's own; float32 for vLLM placed on the "
        "CPU, as the learner there, where vLLM would choose bfloat16, except for a family vLLM's CPU "
        "build runs in bfloat16 only, Qwen 3.5's), 'float32', 'bfloat16', 'float16'.",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="Extra command-line arguments for the vLLM server (e.g. [--max-num-seqs, 128]).",
    )
    devices: list[int] | None = Field(
        default=None,
        description="GPU indices vLLM gets (its CUDA_VISIBLE_DEVICES): data_parallel_size replicas of "
        "tensor_parallel_size GPUs each. Unset: the GPUs the learner does not take, filled with as many "
        "replicas as they hold (docs/placement.md). A GPU listed here and also given to the learner is "
        "shared: vLLM takes gpu_memory_utilization of it, the learner the rest.",
    )
    tensor_parallel_size: int | None = Field(
        default=None,
        gt=0,
        description="vLLM's --tensor-parallel-size: GPUs one replica spans. Unset: the smallest of 1, 2, "
        "4, 8 whose share of each GPU (gpu_memory_utilization) holds the model's weights, LoRA slots "
        "and one full-length sequence (1 when the GPUs' memory or the model's size is unknown).",
    )
    data_parallel_size: int | None = Field(
        default=None,
        gt=0,
        description="vLLM's --data-parallel-size: replicas of the model in the one vLLM server, each on "
        "tensor_parallel_size GPUs of its own (vLLM balances calls across them and loads every adapter "
        "into each). Unset: as many as vLLM's GPUs hold.",
    )
    gpu_memory_utilization: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="vLLM's --gpu-memory-utilization: the share of each of its GPUs vLLM takes "
        "(weights + KV cache). Unset: derived by the plan from what vLLM needs (its weights as the "
        "checkpoint stores them, LoRA slots, the KV cache of the run's rollouts, CUDA graphs; "
        "docs/placement.md), at most 0.95, and at least the default shown (vLLM's own) on GPUs vLLM "
        "does not share with the learner, or where the GPU's memory is unknown.",
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
        "wakes (POST /wake_up) before the new adapter is loaded. Unset: the plan turns it on where "
        "the learner shares a GPU with vLLM and the run does not fit otherwise.",
    )
    sleep_level: Literal[1, 2] = Field(
        default=1,
        description="vLLM's sleep level: 1 offloads the weights to CPU memory and drops the KV "
        "cache. 2 (drop the weights too) is refused: vLLM wakes from it with the weights gone, and "
        "rftkit does not reload them.",
    )
    max_lora_rank: int | None = Field(
        default=None,
        gt=0,
        description="vLLM's --max-lora-rank, at least the adapter's rank. Unset: the smallest rank "
        "vLLM accepts (1, 8, 16, 32, 64, 128, 256, 320, 512) that holds the adapter's (init_adapter's, "
        "else lora.r). vLLM pads every adapter to this rank, and its CPU build copies each token's "
        "padded LoRA matrices, so a larger rank costs sampling time for nothing.",
    )
    max_loras: int = Field(
        default=2, gt=0, description="vLLM's --max-loras: adapter versions resident at once (old + new)."
    )
    startup_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="Seconds to wait for a started vLLM server to answer /health; with a ray section, "
        "also the bound on the inference replicas' first start.",
    )
    # --- tool calls and reasoning (vLLM's own parser names; the hf engine reads them too)
    tool_call_parser: str | None = Field(
        default="auto",
        description="vLLM's --tool-call-parser, with --enable-auto-tool-choice. 'auto': the model "
        "family's, read from its config.json (hermes for Llama/Qwen2/Qwen3 and the chatml-tools "
        "template, qwen3_coder for Qwen 3.5/3.6, openai for gpt-oss, gemma4 for Gemma 4; "
        "docs/models.md), and a model no family covers stops the run with a sentence; a name (any "
        "parser your vLLM lists) wins; null: tool calls stay in the text. The hf engine reads it too "
        "and parses as the family whose vLLM parser it names.",
    )
    reasoning_parser: str | None = Field(
        default="auto",
        description="vLLM's --reasoning-parser: 'auto': the model family's (qwen3 for Qwen3 and "
        "Qwen 3.5/3.6, openai_gptoss for gpt-oss, none for Llama), a name (any parser your vLLM lists) wins, "
        "null: none. The reasoning comes back as reasoning_content and its tokens stay in the "
        "recorded completion.",
    )

    @field_validator("attach_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        return None if value is None else http_url(value)

    @model_validator(mode="after")
    def _devices_match_tensor_parallel(self) -> VLLMConfig:
        if self.devices is None:
            return self
        if (
            len(set(self.devices)) != len(self.devices)
            or min(self.devices, default=0) < 0
            or not self.devices
        ):
            raise ValueError(f"devices must be distinct GPU indices >= 0, got {self.devices}")
        groups = (self.tensor_parallel_size or 1) * (self.data_parallel_size or 1)
        if len(self.devices) % groups or (
            self.tensor_parallel_size and self.data_parallel_size and len(self.devices) != groups
        ):
            raise ValueError(
                f"devices lists {len(self.devices)} GPU(s) but tensor_parallel_size x "
                f"data_parallel_size is {self.tensor_parallel_size or 1} x {self.data_parallel_size or 1}: "
                "give vLLM exactly tensor_parallel_size x data_parallel_size GPUs"
            )
        return self

    def lora_rank_for(self, adapter_rank: int) -> int:
        """--max-lora-rank for an adapter of ``adapter_rank``: the setting, else the smallest rank
        vLLM accepts that holds it."""
        if self.max_lora_rank is not None:
            return self.max_lora_rank
        fitting = [rank for rank in VLLM_LORA_RANKS if rank >= adapter_rank]
        if not fitting:
            raise ValueError(
                f"vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}; the adapter's is {adapter_rank}"
            )
        return fitting[0]

    def dtype_for(self, on_gpus: bool, cpu_dtype: str | None = None) -> str:
        """--dtype: the setting; 'auto' for vLLM without a GPU is float32, as the learner computes
        there (vLLM's CPU build would pick bfloat16 even for a float32 model), or ``cpu_dtype``, the
        one dtype that build runs the model's family in (Qwen 3.5's bfloat16)."""
        return (cpu_dtype or "float32") if self.dtype == "auto" and not on_gpus else self.dtype
