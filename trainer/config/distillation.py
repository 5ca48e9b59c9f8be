"""The distillation section: on-policy distillation from a teacher beside GRPO's reward
(docs/distillation.md)."""

from __future__ import annotations

from pydantic import Field

from trainer.config.common import ConfigPath, _Section

# The TrainConfig field's description, kept here so the section's whole story is in one place.
DISTILLATION_FIELD = (
    "On-policy distillation: a teacher scores every sampled token and the per-token reverse KL to it "
    "enters the loss beside the outcome advantage (docs/distillation.md); unset: GRPO alone."
)


class DistillationConfig(_Section):
    """On-policy distillation: the teacher's logprobs of the student's own tokens, as a per-token advantage
    ``reward_weight * A_grpo - weight * (log pi_student - log pi_teacher)`` (docs/distillation.md)."""

    teacher: ConfigPath = Field(
        description="The teacher: a local model directory in transformers format (relative to the config "
        "file) whose tokenizer is the policy's (same ids for the same text: it scores the student's own "
        "token ids); loaded beside the learner, on its device and in its dtype, and run without "
        "gradients. A teacher with another tokenizer is refused at start.",
    )
    teacher_adapter: ConfigPath | None = Field(
        default=None,
        description="A peft LoRA adapter merged into the teacher (e.g. an earlier run's final adapter on "
        "the same base model); unset: the teacher directory alone.",
    )
    weight: float = Field(
        default=1.0,
        ge=0,
        description="Coefficient of the per-token reverse KL (student logprob minus teacher logprob of "
        "each sampled token) in the advantage; 0: GRPO as without this section.",
    )
    reward_weight: float = Field(
        default=1.0,
        ge=0,
        description="Coefficient of GRPO's outcome advantage; 0: distillation alone (the reward is still "
        "recorded). While weight > 0, a group whose rewards are all equal is trained on its distillation "
        "term instead of being dropped.",
    )
