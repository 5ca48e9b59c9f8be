"""The model-family registry: one module per family, looked up by name or by a model's config.json.

Everything that varies by family (chat format, tool-call and reasoning parsers, reasoning switch,
training attention, tiny builder) lives in that family's module; see ``base.py``.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from policy_server.models.families.base import Family, ParsedCompletion, TinySizes

# family name -> module defining ``FAMILY``; imported on first use, so the registry stays light.
_MODULES: dict[str, str] = {
    "llama": "policy_server.models.families.llama",
    "qwen2_vl": "policy_server.models.families.qwen2_vl",
    "qwen3": "policy_server.models.families.qwen3",
    "qwen3_vl": "policy_server.models.families.qwen3_vl",
    "gemma4": "policy_server.models.families.gemma4",
    "gpt_oss": "policy_server.models.families.gpt_oss",
}


# What a model no family covers is served as: hermes tool calls, no reasoning parser.
HERMES = Family()


class UnknownFamilyError(ValueError):
    """A model whose family rftkit does not know, or a family name it does not know."""


def family_names() -> tuple[str, ...]:
    """Every registered family's name, in registry order."""
    return tuple(_MODULES)


def family(name: str) -> Family:
    """The family registered under ``name``."""
    if name not in _MODULES:
        raise UnknownFamilyError(f"unknown model family {name!r}; choose one of: {', '.join(_MODULES)}")
    found: Family = importlib.import_module(_MODULES[name]).FAMILY
    return found


def family_for_model_type(model_type: str) -> Family | None:
    """The family covering a config.json ``model_type``, or None when no family does."""
    for name in _MODULES:
        candidate = family(name)
        if model_type in candidate.model_types:
            return candidate
    return None


def model_type_of(model_dir: str | Path) -> str:
    """The ``model_type`` in a model directory's config.json."""
    path = Path(model_dir) / "config.json"
    try:
        model_type = json.loads(path.read_text()).get("model_type")
    except (OSError, ValueError) as error:
        raise UnknownFamilyError(f"cannot read the model's family from {path}: {error}") from error
    if not isinstance(model_type, str):
        raise UnknownFamilyError(f"{path} names no model_type")
    return model_type


def family_of(model_dir: str | Path) -> Family | None:
    """The family of the model in ``model_dir``, or None when rftkit knows none for it."""
    return family_for_model_type(model_type_of(model_dir))


__all__ = [
    "HERMES",
    "Family",
    "ParsedCompletion",
    "TinySizes",
    "UnknownFamilyError",
    "family",
    "family_for_model_type",
    "family_names",
    "family_of",
    "model_type_of",
]
