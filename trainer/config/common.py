"""What every config section shares: the error type, path and device fields, the strict base model."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    ValidationInfo,
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
