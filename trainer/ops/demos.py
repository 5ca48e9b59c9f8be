"""``rft show RUN --export-demos FILE --min-reward X``: a run's good episodes as ``rft sft --data``
demonstrations.

Reads the run's transcripts (:mod:`trainer.ops.transcripts`), never torch. Each kept episode with a
reward of at least X becomes one line: the messages of its last model call as the gateway recorded
them, ending with the model's answer (content and parsed tool calls), and the tool list that call
offered: the format of docs/sft.md, rendered by `rft sft` as the policy server rendered the call.
Evaluations replay the same rows and seeds, so identical demonstrations are written once.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRANSCRIPTS_DIR = "transcripts"  # trainer.ops.transcripts.TRANSCRIPTS_DIR, without importing its deps
# How the gateway marks a message text it clipped for its record (policy_server.trace): such a
# conversation is not the one the model saw, so it is no demonstration.
CLIPPED_MARKER = " chars not kept]"


class DemosError(Exception):
    """No demonstrations can be collected; the message says why and what to change."""


@dataclass
class Collected:
    """The demonstrations found, and how many episodes were passed over and why."""

    demonstrations: list[dict[str, Any]] = field(default_factory=list)
    episodes: int = 0
    below: int = 0  # failed, or a reward under the threshold
    unusable: int = 0  # no messages kept, clipped, or not ending with the model's answer
    duplicates: int = 0


def demonstration(episode: dict[str, Any]) -> dict[str, Any] | None:
    """The episode as a demonstration, or None when its conversation cannot be one."""
    messages = episode.get("messages") or []
    if not messages or messages[-1].get("role") != "assistant" or CLIPPED_MARKER in json.dumps(messages):
        return None
    last = dict(messages[-1])
    if not last.get("tool_calls"):
        last.pop("tool_calls", None)
    line: dict[str, Any] = {"messages": [*messages[:-1], last]}
    if episode.get("tools"):
        line["tools"] = episode["tools"]
    return line


def transcript_files(run_dir: Path, kind: str | None, step: int | None) -> list[Path]:
    """The transcript files to read: one step's or evaluation's, else all of the run's."""
    if not (run_dir / TRANSCRIPTS_DIR).is_dir():
        raise DemosError(f"{run_dir} holds no {TRANSCRIPTS_DIR}/: name a run's output_dir")
    if kind is not None and step is not None:
        path = run_dir / TRANSCRIPTS_DIR / f"{kind}-{step:04d}.jsonl"
        if not path.is_file():
            raise DemosError(f"no transcripts of {kind} {step} in {run_dir}")
        return [path]
    return sorted((run_dir / TRANSCRIPTS_DIR).glob("*.jsonl"))


def collect(files: list[Path], min_reward: float) -> Collected:
    """The demonstrations of the episodes in ``files`` whose reward is at least ``min_reward``."""
    found = Collected()
    seen: set[str] = set()
    for path in files:
        for text in path.read_text().splitlines():
            try:
                episode = json.loads(text)
            except ValueError:  # a line being written
                continue
            found.episodes += 1
            reward = episode.get("reward")
            if not isinstance(reward, int | float) or not math.isfinite(reward) or reward < min_reward:
                found.below += 1
                continue
            line = demonstration(episode)
            key = json.dumps(line, sort_keys=True)
            if line is None:
                found.unusable += 1
            elif key in seen:
                found.duplicates += 1
            else:
                seen.add(key)
                found.demonstrations.append(line)
    return found


def export_demos(run_dir: Path, out: Path, min_reward: float, kind: str | None, step: int | None) -> str:
    """Write the demonstrations of ``run_dir`` to ``out``; the sentence saying what was written."""
    found = collect(transcript_files(run_dir, kind, step), min_reward)
    if not found.demonstrations:
        raise DemosError(
            f"none of the {found.episodes} episodes kept in {run_dir} has a reward of at least "
            f"{min_reward:g} and a whole conversation: lower --min-reward, or keep more episodes "
            "(transcripts.per_step, transcripts.per_eval)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(line) + "\n" for line in found.demonstrations))
    return (
        f"wrote {len(found.demonstrations)} demonstrations to {out} from {found.episodes} kept episodes "
        f"({found.below} failed or under reward {min_reward:g}, {found.unusable} without a whole "
        f"conversation, {found.duplicates} repeated); warm-start with: rft sft --data {out}"
    )


def episode_demonstrations(calls: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """Every model call of one episode as demonstrations (``rft collect``): each call's messages as the
    gateway recorded them, its answer (``content``, ``tool_calls``) and its ``tools``, in order.

    A call whose conversation the next call carries on (the next call's messages start with this
    one's and add this answer and what followed) is left to that later line, where `rft sft` trains on
    every assistant turn. An agent that keeps only the latest observation (the maze's) gives one line
    per call; one that keeps its history, one line for the whole episode. A call that cannot be a
    demonstration (no messages kept, a conversation the gateway clipped) gives None in its place.
    """
    lines: list[dict[str, Any] | None] = []
    for index, call in enumerate(calls):
        messages = call.get("messages") or []
        later = calls[index + 1].get("messages") or [] if index + 1 < len(calls) else []
        if messages and len(later) > len(messages) + 1 and later[: len(messages)] == messages:
            continue
        if not messages:
            lines.append(None)
            continue
        answer: dict[str, Any] = {"role": "assistant", "content": call.get("content")}
        if call.get("tool_calls"):
            answer["tool_calls"] = call["tool_calls"]
        lines.append(demonstration({"messages": [*messages, answer], "tools": call.get("tools")}))
    return lines
