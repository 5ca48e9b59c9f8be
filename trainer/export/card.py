"""The model card ``rft export`` writes (``README.md`` in the export): the base, the adapter version and
steps, the run's last evaluation, the config's key fields, the check it passed and how to serve it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from policy_server.engines import vllm_family_env, vllm_serve_arguments, vllm_shell_command
from policy_server.models.families import Parsers, UnknownFamilyError, resolve_parsers
from trainer.config.engines import VLLM_LORA_RANKS
from trainer.export.source import ExportSource
from trainer.export.verify import Verification

# The config fields that say what was trained and how; the rest is in the run's config.json.
KEY_FIELDS = (
    "model",
    "chat_template",
    "engine",
    "train_file",
    "eval_file",
    "num_generations",
    "rows_per_step",
    "max_steps",
    "learning_rate",
    "loss_type",
    "beta",
    "temperature",
    "lora",
    "seed",
)


def _origin(source: ExportSource) -> str:
    if source.run_dir is None:
        return f"the adapter directory `{source.adapter_dir}`"
    steps = "" if source.steps is None else f", published after step {source.steps}"
    return f"adapter version {source.version} of the run `{source.run_dir}`{steps}"


def _evaluation(evaluation: dict[str, Any] | None) -> list[str]:
    if evaluation is None:
        return ["The run recorded no evaluation."]
    failures = f", {evaluation['failed']} failed" if evaluation.get("failed") else ""
    reward = evaluation.get("mean_reward")
    reward_text = "-" if reward is None else format(reward, ".4f")  # null: no rollout was scored
    return [
        f"At step {evaluation.get('step')} (adapter version {evaluation.get('adapter_version')}): success "
        f"{evaluation.get('success_rate', 0.0):.1%}, mean reward {reward_text}, "
        f"{evaluation.get('scored')} rollouts scored{failures}."
    ]


def _config(config: dict[str, Any]) -> list[str]:
    if not config:
        return ["Not recorded (the run directory holds no config.json)."]
    rows = ["| field | value |", "|---|---|"]
    rows += [f"| `{name}` | `{json.dumps(config[name])}` |" for name in KEY_FIELDS if name in config]
    return rows


def _vllm_rank(rank: int) -> int:
    """vLLM's --max-lora-rank for an adapter of ``rank``: the smallest it accepts that holds it."""
    return min((allowed for allowed in VLLM_LORA_RANKS if allowed >= rank), default=rank)


def _parsers(source: ExportSource) -> tuple[Parsers | None, str | None]:
    """The parsers the run's engine used (its vllm settings, else the family's), or None and why not."""
    settings = source.config.get("vllm") or {}
    try:
        return resolve_parsers(
            source.base_model,
            settings.get("tool_call_parser", "auto"),
            settings.get("reasoning_parser", "auto"),
        ), None
    except UnknownFamilyError as error:
        return None, f"# no tool-call or reasoning parser below: {error}"


def serving_commands(source: ExportSource, out: Path, *, merge: bool, dtype: torch.dtype) -> list[str]:
    """How to serve the export: vLLM's OpenAI server as rftkit's vllm engine starts it (the policy's
    parsers, its chat template, the adapter, the dtype the export was checked in), then `rft serve
    --inference` (docs/serving.md). Comment lines (``#``) say what the vLLM command could not know."""
    parsers, unknown = _parsers(source)
    tool_call, reasoning = (parsers.tool_call, parsers.reasoning) if parsers else (None, None)
    name = str(dtype).removeprefix("torch.")
    if merge:
        arguments = vllm_serve_arguments(
            out, served_name=out.name, dtype=name, tool_call_parser=tool_call, reasoning_parser=reasoning
        )
        inference = f"rft serve --inference --model {out}"
    else:
        arguments = vllm_serve_arguments(
            source.base_model,
            dtype=name,
            max_lora_rank=_vllm_rank(source.lora_rank),
            lora_modules={out.name: out},
            tool_call_parser=tool_call,
            reasoning_parser=reasoning,
            chat_template=out / "chat_template.jinja" if source.chat_template else None,
        )
        inference = f"rft serve --inference --model {source.base_model} --adapter {out}" + (
            f" --chat-template {source.chat_template}" if source.chat_template else ""
        )
    vllm = vllm_shell_command(arguments, vllm_family_env(source.base_model))
    return [*([unknown] if unknown else []), vllm, inference]


def write_card(
    directory: Path,
    out: Path,
    source: ExportSource,
    *,
    merge: bool,
    dtype: torch.dtype,
    verification: Verification,
) -> None:
    """``directory/README.md`` for an export written in ``directory`` that will be renamed ``out``."""
    kind = "merged weights (peft's merge_and_unload)" if merge else "a peft LoRA adapter"
    lines = [
        f"# {out.name}",
        "",
        f"GRPO-trained with rftkit: {kind} in {str(dtype).removeprefix('torch.')}.",
        "",
        f"- base model: `{source.base_model}`",
        f"- from: {_origin(source)}",
        f"- {verification.sentence()}",
        "",
        "## Last evaluation",
        "",
        *_evaluation(source.evaluation),
        "",
        "## Config (key fields)",
        "",
        *_config(source.config),
        "",
        "## Serve",
        "",
        "```bash",
        *serving_commands(source, out, merge=merge, dtype=dtype),
        "```",
        "",
    ]
    (directory / "README.md").write_text("\n".join(lines))
