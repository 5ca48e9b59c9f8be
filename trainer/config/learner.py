"""The learner section: where and how the trained model runs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainer.config.common import DeviceName, TorchDtype, _Section


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
        "layer's, for about a third more compute. Unset: the plan turns it on where the run does not "
        "fit otherwise.",
    )
    logits_chunk_size: int = Field(
        default=1024,
        gt=0,
        description="Completion tokens per output-head chunk when computing token logprobs: the "
        "[tokens, vocabulary] float32 logits exist one chunk at a time (and are recomputed in the "
        "backward pass), never for the whole micro-batch.",
    )
    processes: int | None = Field(
        default=None,
        ge=1,
        description="Learner processes on this node without Ray, one device each, joined in one "
        "torch.distributed group (NCCL on GPUs, gloo on CPU); a step's micro-batches are dealt out "
        "among them. Unset: what the plan chooses (one on CPU; on GPUs, the learner's GPUs of the "
        "placement). With a ray section, ray.learner_workers says it instead.",
    )
    shard: Literal["auto", "off", "fsdp"] = Field(
        default="auto",
        description="Whether the learner's processes (with a ray section, its learner workers) shard "
        "the frozen base model and the LoRA parameters with torch FSDP2 (fully_shard: each process "
        "holds a shard, forward and backward gather one decoder layer at a time): 'fsdp' always, 'off' "
        "never (each process holds the whole model: plain data parallel), 'auto' when the learner has "
        "several processes on this node and the model does not fit one device beside its update, as "
        "`rft plan` counts it (with a ray section, 'auto' keeps the whole model on every worker).",
    )
    collective_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="Seconds a learner process waits in one collective (an all-gather, a "
        "reduce-scatter, an all-reduce) for the other learner processes before the step fails with a "
        "sentence naming the rank that died or did not answer, instead of waiting forever. It bounds "
        "the gap between two ranks reaching the same collective, so it must exceed the slowest "
        "micro-batch's forward and backward. The trainer waits for learner processes that all went "
        "silent (no answer, no micro-batch finished) this long plus 30 s, then ends the step naming "
        "them.",
    )
