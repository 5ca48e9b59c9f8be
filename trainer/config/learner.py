"""The learner section: where and how the trained model runs."""

from __future__ import annotations

from pydantic import (
    Field,
)

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
        "layer's, for about a third more compute.",
    )
    logits_chunk_size: int = Field(
        default=1024,
        gt=0,
        description="Completion tokens per output-head chunk when computing token logprobs: the "
        "[tokens, vocabulary] float32 logits exist one chunk at a time (and are recomputed in the "
        "backward pass), never for the whole micro-batch.",
    )
