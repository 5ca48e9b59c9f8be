"""The model-family registry: one module per family, looked up by name or by a model's config.json.

Everything that varies by family (chat format, tool-call and reasoning parsers, reasoning switch,
training attention, tiny builder) lives in that family's module; see ``base.py``.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path

from policy_server.models.families.argument_types import tool_call_problem
from policy_server.models.families.base import Family, ParsedCompletion, TinySizes, VisionParts

# family name -> module defining ``FAMILY``; imported on first use, so the registry stays light.
_MODULES: dict[str, str] = {
    "llama": "policy_server.models.families.llama",
    "qwen2_vl": "policy_server.models.families.qwen2_vl",
    "qwen3": "policy_server.models.families.qwen3",
    "qwen3_vl": "policy_server.models.families.qwen3_vl",
    "qwen3_5": "policy_server.models.families.qwen3_5",
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


# A parser setting that means "the model family's own".
AUTO = "auto"


@dataclass(frozen=True)
class Parsers:
    """The tool-call and reasoning parsers (vLLM's names; None: no parser) an engine uses for a model."""

    tool_call: str | None
    reasoning: str | None
    model_type: str
    family: Family | None  # the model's; None when no family covers its model_type

    def describe_tool_calls(self) -> str:
        """In words: the model's family, the tool-call parser in use and the one the family expects."""
        in_use = (
            f"vLLM's {self.tool_call!r} parser" if self.tool_call else "no parser (tool_call_parser null)"
        )
        if self.family is None:
            return (
                f"the engine parses tool calls with {in_use}; the model (model_type "
                f"{self.model_type!r}) belongs to no family rftkit knows, so none is expected"
            )
        expected = self.family.vllm_tool_call_parser
        return (
            f"the engine parses tool calls with {in_use}; the model's family, {self.family.name}, "
            f"expects {expected!r}"
            + (" (vllm.tool_call_parser: auto picks it)" if expected != self.tool_call else "")
        )


def resolve_parsers(
    model_dir: str | Path, tool_call_parser: str | None = AUTO, reasoning_parser: str | None = AUTO
) -> Parsers:
    """The parsers for the model in ``model_dir``: an explicit setting (a name, or None for none)
    wins; ``auto`` is the model family's. ``auto`` for a model no family covers is refused with a
    sentence naming its model_type and the settings to give."""
    model_type = model_type_of(model_dir)
    found = family_for_model_type(model_type)
    if found is None and AUTO in (tool_call_parser, reasoning_parser):
        raise UnknownFamilyError(
            f"the model in {model_dir} has model_type {model_type!r}, which no model family rftkit knows "
            f"covers ({', '.join(_MODULES)}), so its parsers cannot be picked automatically: set "
            "vllm.tool_call_parser and vllm.reasoning_parser (rft serve: --tool-call-parser and "
            "--reasoning-parser) to vLLM's parser names for its format, or to null (none) for no parser"
        )
    return Parsers(
        tool_call=found.vllm_tool_call_parser if tool_call_parser == AUTO and found else tool_call_parser,
        reasoning=found.vllm_reasoning_parser if reasoning_parser == AUTO and found else reasoning_parser,
        model_type=model_type,
        family=found,
    )


def parsing_family(parsers: Parsers) -> Family:
    """The family whose parsing the hf engine applies: the model's when it uses the tool-call parser
    set (or none is set), else the family whose vLLM tool-call parser has that name (one whose
    reasoning parser matches too first); a name no family uses is refused with a sentence."""
    own = parsers.family
    if parsers.tool_call is None or (own is not None and own.vllm_tool_call_parser == parsers.tool_call):
        return own or HERMES
    matching = [family(name) for name in _MODULES if family(name).vllm_tool_call_parser == parsers.tool_call]
    if not matching:
        names = sorted({parser for name in _MODULES if (parser := family(name).vllm_tool_call_parser)})
        raise UnknownFamilyError(
            f"the hf engine parses tool calls as a model family does, and no family uses vLLM's "
            f"{parsers.tool_call!r} parser; set vllm.tool_call_parser (rft serve: --tool-call-parser) "
            f"to one of {', '.join(names)}, to auto (the model family's) or to null (none)"
        )
    return next(
        (found for found in matching if found.vllm_reasoning_parser == parsers.reasoning), matching[0]
    )


__all__ = [
    "AUTO",
    "HERMES",
    "Family",
    "ParsedCompletion",
    "Parsers",
    "TinySizes",
    "UnknownFamilyError",
    "VisionParts",
    "family",
    "family_for_model_type",
    "family_names",
    "family_of",
    "model_type_of",
    "parsing_family",
    "resolve_parsers",
    "tool_call_problem",
]
