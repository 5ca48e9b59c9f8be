"""Transcripts: a few episodes of every training step and evaluation, as JSONL in the run directory.

``transcripts/step-NNNN.jsonl`` and ``transcripts/eval-NNNN.jsonl`` (NNNN: the step; an evaluation's is
the step it followed) hold one episode a line: its dataset row, the messages of its last model call
as the gateway recorded them plus that call's completion (the prompt's tokens decoded where no
messages were kept) and its tool list, each call's completion text with its tool calls parsed as the
policy server parses them, the reward, the agent's metrics, and the failure text of a failed rollout.
`rft show` prints them (:mod:`trainer.ops.show`).

Which episodes: ``transcripts.per_step`` of a step, picked by a ``random.Random`` of their own seeded
from the run's seed and the step (no random stream of the run moves, so a run computes the same
numbers with or without transcripts), and ``transcripts.per_eval`` of an evaluation, picked by the
seed alone: evaluations play the same rows with the same seeds, so every evaluation keeps the same
episodes. Besides those, the step's (or evaluation's) best and worst episode by reward (a failed
rollout counting as the worst), where rewards differ: what ``rft show --best/--worst`` and
``--export-demos`` look for, so a step's one success is never left out by the draw. Each line says
why it was kept (``kept``: ``sample``, ``best``, ``worst``). The cost is a few episodes' tokens
decoded per step; the tokenizer loads on first use.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from handlers import FailureCause
from policy_server import CallRecord
from policy_server.http import parse_tool_calls
from trainer.config import TranscriptsConfig
from trainer.rollouts.dataset import derived_seed

if TYPE_CHECKING:
    from trainer.rollouts.producer import PlayedRollout

TRANSCRIPTS_DIR = "transcripts"
Decode = Callable[[list[int], bool], str]  # (token ids, keep special tokens) -> text


def transcript_path(run_dir: Path, kind: str, step: int) -> Path:
    """Where a step's (``kind`` "step") or an evaluation's ("eval") transcripts are."""
    return run_dir / TRANSCRIPTS_DIR / f"{kind}-{step:04d}.jsonl"


def pick(count: int, total: int, *key: object) -> list[int]:
    """``count`` positions of ``total`` (all when fewer), in order, the same for the same ``key``."""
    if count >= total:
        return list(range(total))
    return sorted(random.Random(derived_seed(*key)).sample(range(total), count))


class TranscriptKeeper:
    """Writes the picked episodes of each step and evaluation of one run."""

    def __init__(
        self, run_dir: Path, config: TranscriptsConfig, seed: int, model_dir: Path, chat_template: str | None
    ) -> None:
        self.run_dir = run_dir
        self.config = config
        self.seed = seed
        self.model_dir = model_dir
        self.chat_template = chat_template
        self._tokenizer: Any = None

    def keep_step(self, step: int, played: list[PlayedRollout]) -> None:
        self._keep("step", step, played, self.config.per_step, (self.seed, "transcripts", "step", step))

    def keep_eval(self, step: int, played: list[PlayedRollout]) -> None:
        self._keep("eval", step, played, self.config.per_eval, (self.seed, "transcripts", "eval"))

    def _keep(
        self, kind: str, step: int, played: list[PlayedRollout], count: int, key: tuple[Any, ...]
    ) -> None:
        if count == 0 or not played:
            return
        reasons: dict[int, list[str]] = {index: ["sample"] for index in pick(count, len(played), *key)}
        for reason, index in extremes(played).items():
            reasons.setdefault(index, []).append(reason)
        lines = [
            json.dumps(
                _strict(
                    {
                        "kind": kind,
                        "step": step,
                        "kept": reasons[index],
                        **episode(played[index], self.decode),
                    }
                )
            )
            for index in sorted(reasons)
        ]
        path = transcript_path(self.run_dir, kind, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Whole or absent: a resumed run writes a replayed step's file again.
        partial = path.with_suffix(".jsonl.partial")
        partial.write_text("".join(line + "\n" for line in lines))
        partial.replace(path)

    def decode(self, ids: list[int], keep_special: bool) -> str:
        if self._tokenizer is None:
            from policy_server.models import load_tokenizer

            self._tokenizer = load_tokenizer(self.model_dir, self.chat_template)
        return str(self._tokenizer.decode(ids, skip_special_tokens=not keep_special))


def extremes(played: list[PlayedRollout]) -> dict[str, int]:
    """The positions of the best and the worst episode by reward (the first of equals; a failed
    rollout, which has none, is the worst); none where every episode scored alike."""
    scores = [
        rollout.outcome.reward
        if rollout.outcome.ok and rollout.outcome.reward is not None and math.isfinite(rollout.outcome.reward)
        else -math.inf
        for rollout in played
    ]
    if max(scores) == min(scores):
        return {}
    return {"best": scores.index(max(scores)), "worst": scores.index(min(scores))}


def episode(rollout: PlayedRollout, decode: Decode) -> dict[str, Any]:
    """One episode as a transcript line (without its kind and step)."""
    request, outcome, trace = rollout.request, rollout.outcome, rollout.trace
    calls = [call_view(call, decode) for call in trace.calls]
    last = trace.calls[-1] if trace.calls else None
    messages: list[dict[str, Any]] = []
    prompt_text = None
    if last is not None and last.messages:
        reply = calls[-1]
        messages = [*last.messages, {"role": "assistant", "content": reply["content"]}]
        if reply["tool_calls"]:
            messages[-1]["tool_calls"] = reply["tool_calls"]
    elif last is not None:
        prompt_text = decode(last.prompt_token_ids, True)
    return {
        "rollout_id": request.rollout_id,
        "row_index": request.row_index,
        "row_name": request.row_name,
        "group": request.group_index,
        "seed": request.inference_params.seed if request.inference_params else None,
        "row": request.row,
        "status": outcome.status,
        "reward": outcome.reward,
        "rewards": outcome.rewards,
        "metrics": outcome.metrics,
        "failure": None if outcome.ok else {"cause": _cause(outcome.cause), "error": outcome.error},
        "messages": messages,
        # The tool list of the last call, so its messages can be rendered as the model saw them again
        # (a demonstration for `rft sft`: `rft show --export-demos`).
        "tools": last.tools if last is not None else None,
        "prompt_text": prompt_text,
        "calls": calls,
    }


def call_view(call: CallRecord, decode: Decode) -> dict[str, Any]:
    """A call's completion as the gateway answered it: the text, and its tool calls when it parsed any
    (the gateway parses only a call that offered tools, and then answers ``tool_calls``)."""
    text = decode(call.completion_token_ids, False)
    content, tool_calls = parse_tool_calls(text) if call.finish_reason == "tool_calls" else (text or None, [])
    return {
        "index": call.index,
        "adapter_version": call.adapter_version,
        "finish_reason": call.finish_reason,
        "prompt_tokens": len(call.prompt_token_ids),
        "completion_tokens": len(call.completion_token_ids),
        "completion": text,
        "content": content,
        "tool_calls": tool_calls,
        "unparsed_tool_call": call.unparsed_tool_call,
    }


def _cause(cause: FailureCause | None) -> str | None:
    return None if cause is None else cause.value


def _strict(value: Any) -> Any:
    """``value`` with NaN and infinities as None: strict JSON, as metrics.jsonl writes it."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_strict(item) for item in value]
    return value
