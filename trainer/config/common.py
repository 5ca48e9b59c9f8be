"""What every config section shares: the error type, path and device fields, the strict base model."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
)

# The validation context key that carries the directory relative paths are resolved against.
BASE_DIR_KEY = "base_dir"


RewardAggregation = Literal["sum", "last", "mean"]
# TRL's vllm_importance_sampling_mode values (trainer.algo.grpo implements them; config stays torch-free).
ImportanceSamplingMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]

# TrainConfig.reasoning_effort, its values as the families with the switch read them (gpt-oss).
ReasoningEffort = Annotated[
    Literal["low", "medium", "high"] | None,
    Field(
        description="Reasoning effort of every training and evaluation call that sends none (the agent's "
        "own reasoning_effort, or chat_template_kwargs' one, wins): the gateway sets it on the call, and "
        "the family's template reads it (gpt-oss: 'Reasoning: low' in its system message). A model family "
        "without the switch (Qwen3 and Gemma 4 switch thinking with enable_thinking instead) refuses it "
        "at run start. Unset: the family's default (gpt-oss: medium). rft plan and rft train say when "
        "max_completion_length is below what the family's reasoning takes at this effort (docs/models.md)."
    ),
]


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
