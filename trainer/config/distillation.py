"""The distillation section: on-policy distillation from a teacher beside GRPO's reward
(docs/distillation.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, PlainValidator, ValidationInfo, model_validator

from handlers import http_url
from trainer.config.common import ConfigPath, _resolve_path, _Section

# The TrainConfig field's description, kept here so the section's whole story is in one place.
DISTILLATION_FIELD = (
    "On-policy distillation: a teacher scores every sampled token and the per-token reverse KL to it "
    "enters the loss beside the outcome advantage (docs/distillation.md); unset: GRPO alone."
)


def _teacher_location(value: Any, info: ValidationInfo) -> Path | str:
    """An http(s) URL as given (checked, without its trailing slash); anything else a path, relative to
    the config file."""
    if isinstance(value, str) and value.strip().startswith(("http://", "https://")):
        return http_url(value, "distillation.teacher")
    if isinstance(value, str | Path):
        return _resolve_path(Path(value), info)
    raise ValueError("distillation.teacher must be a model directory or an http(s) URL of a vLLM server")


# A model directory (a path, relative to the config file) or an endpoint (an http(s) URL, a str).
TeacherLocation = Annotated[Path | str, PlainValidator(_teacher_location)]


class DistillationConfig(_Section):
    """On-policy distillation: the teacher's logprobs of the student's own tokens, as a per-token advantage
    ``reward_weight * A_grpo - weight * (log pi_student - log pi_teacher)`` (docs/distillation.md)."""

    teacher: TeacherLocation = Field(
        description="The teacher, whose tokenizer must be the policy's (same ids for the same text: it "
        "scores the student's own token ids; another is refused at start): a local model directory in "
        "transformers format (relative to the config file), loaded beside the learner on its device and "
        "in its dtype and run without gradients; or the OpenAI base URL of a vLLM server "
        "(http://host:8000/v1) serving teacher_model, which scores the tokens with vLLM's prompt_logprobs.",
    )
    teacher_adapter: ConfigPath | None = Field(
        default=None,
        description="A peft LoRA adapter merged into a teacher directory (e.g. an earlier run's final "
        "adapter on the same base model); unset: the teacher directory alone. An endpoint teacher serves "
        "its adapters itself: name one with teacher_model.",
    )
    teacher_model: str | None = Field(
        default=None,
        description="With an endpoint teacher: the model name it serves (vllm serve's "
        "--served-model-name, a LoRA adapter's name from --lora-modules, or the model path it was "
        "started with; its /v1/models lists them). Required with a URL, refused with a directory.",
    )
    teacher_api_key_env: str | None = Field(
        default=None,
        min_length=1,
        description="With an endpoint teacher: the name of the environment variable that holds its key "
        "(sent as a bearer token), e.g. VLLM_API_KEY, the variable vllm serve reads its --api-key from; "
        "the key itself stays out of the config and the run's records. Unset: no key.",
    )
    teacher_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="With an endpoint teacher: the deadline of one scoring request (up to "
        "max_tokens_per_microbatch tokens). A request that fails in transport (refused, reset, timed "
        "out, 429, 502, 503, 504) is retried as a rollout is (max_retries, retry_backoff_s); after "
        "that, or on any other error, the step ends with a sentence naming the endpoint.",
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

    @property
    def endpoint(self) -> str | None:
        """The teacher's URL when it is an endpoint; None for a model directory."""
        return self.teacher if isinstance(self.teacher, str) else None

    @model_validator(mode="after")
    def _endpoint_fields(self) -> DistillationConfig:
        endpoint_only = {
            name: getattr(self, name)
            for name in ("teacher_model", "teacher_api_key_env")
            if getattr(self, name) is not None
        }
        if self.endpoint is None and endpoint_only:
            raise ValueError(
                f"{', '.join(endpoint_only)} apply only to an endpoint teacher (an http(s) URL), but "
                f"distillation.teacher is the directory {self.teacher}: remove them, or give the URL"
            )
        if self.endpoint is not None and self.teacher_model is None:
            raise ValueError(
                f"distillation.teacher {self.endpoint} is an endpoint: name the model it serves with "
                "distillation.teacher_model (its /v1/models lists them)"
            )
        if self.endpoint is not None and self.teacher_adapter is not None:
            raise ValueError(
                f"distillation.teacher {self.endpoint} is an endpoint: it serves its own adapters, so "
                "teacher_adapter does not apply; load the adapter there (vllm serve --lora-modules "
                "NAME=DIR) and set teacher_model: NAME"
            )
        return self
