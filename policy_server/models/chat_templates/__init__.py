"""Chat templates shipped with rftkit, and the ``chat_template`` setting that picks one.

A model's own template may lack a tool section (SmolLM2's has none), so tool-calling agents could
not use it. The setting replaces the template everywhere the conversation is turned into tokens, so
sampler and learner see the same tokens: the hf engine's ``apply_chat_template``, vLLM's
``--chat-template``, and ``rft sft``'s rendering of demonstrations.

The setting is a shipped template's name (``chatml-tools``: ChatML with hermes ``<tool_call>``
blocks, for any model whose turns use ``<|im_start|>``/``<|im_end|>``; ``chatml-tools-vision``: the
same with image parts rendered as Qwen2-VL's ``<|vision_start|><|image_pad|><|vision_end|>``;
``harmony``: gpt-oss's harmony format, the tiny gpt-oss's template; ``qwen3-vl``: Qwen3-VL's format,
the tiny Qwen3-VL's template; ``gemma4``: Gemma 4's format, the tiny Gemma 4's template; ``qwen3``
and ``qwen3_5``: Qwen3's and Qwen 3.5's formats, their tiny models' templates) or a path to a Jinja
file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent

# name -> file in this package
SHIPPED: dict[str, str] = {
    "chatml-tools": "chatml_tools.jinja",
    "chatml-tools-vision": "chatml_tools_vision.jinja",
    "gemma4": "gemma4.jinja",
    "qwen3-vl": "qwen3_vl.jinja",
    "qwen3": "qwen3.jinja",
    "qwen3_5": "qwen3_5.jinja",
    "harmony": "harmony.jinja",
}


class ChatTemplateError(ValueError):
    """A ``chat_template`` setting that names no shipped template and no readable file."""


def chat_template_path(setting: str | Path) -> Path:
    """The Jinja file a ``chat_template`` setting names: a shipped template or a file path."""
    if isinstance(setting, str) and setting in SHIPPED:
        return _HERE / SHIPPED[setting]
    path = Path(setting).expanduser()
    if not path.is_file():
        raise ChatTemplateError(
            f"chat_template {str(setting)!r} is neither a shipped template ({', '.join(SHIPPED)}) "
            "nor a readable file"
        )
    return path.resolve()


def chat_template_text(setting: str | Path) -> str:
    """The template source a ``chat_template`` setting names (surrounding whitespace stripped)."""
    return chat_template_path(setting).read_text().strip()


def load_tokenizer(model_dir: str | Path, chat_template: str | Path | None = None) -> Any:
    """``AutoTokenizer.from_pretrained(model_dir)``, with its chat template replaced when one is set."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if chat_template is not None:
        tokenizer.chat_template = chat_template_text(chat_template)
    return tokenizer
