"""Reading a config file (YAML or TOML) with ``--set`` overrides into a validated ``TrainConfig``."""

from __future__ import annotations

import difflib
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ValidationError,
)

from trainer.config.common import BASE_DIR_KEY, ConfigError
from trainer.config.train import TrainConfig


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


# Names other tools (peft, TRL, vLLM) or habit give a field, which spelling does not find: the hint
# names the field when the section holds it.
ALIASES: dict[str, str] = {
    "rank": "r",
    "lora_rank": "r",
    "lora_r": "r",
    "alpha": "lora_alpha",
    "dropout": "lora_dropout",
    "lr": "learning_rate",
    "kl_coef": "beta",
    "group_size": "num_generations",
    "max_new_tokens": "max_completion_length",
    "importance_sampling_level": "loss_type",  # TRL's sequence level with loss_type grpo is gspo here
    "base_url": "attach_url",
    "vllm_python": "python",
}


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
    name = str(location[-1])
    alias = ALIASES.get(name)
    if alias in model.model_fields:
        return f" (did you mean {alias!r}?)"
    close = difflib.get_close_matches(name, list(model.model_fields), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
