"""``rft show RUN [--step N | --eval N] [--worst | --best] [-n K]``: a run's transcripts, readably.

Reads only ``RUN/transcripts/*.jsonl`` (:mod:`trainer.ops.transcripts` writes them), never torch, so
it works on any machine that can see the run directory, while the run writes it.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

TRANSCRIPTS_DIR = "transcripts"  # trainer.ops.transcripts.TRANSCRIPTS_DIR, without importing its deps


class ShowError(Exception):
    """The run directory holds no such transcripts; the message says what it does hold."""


def kept(run_dir: Path, kind: str) -> list[int]:
    """The steps whose ``kind`` ("step" or "eval") transcripts the run kept, in order."""
    steps = []
    for path in (run_dir / TRANSCRIPTS_DIR).glob(f"{kind}-*.jsonl"):
        number = path.stem[len(kind) + 1 :]
        if number.isdigit():
            steps.append(int(number))
    return sorted(steps)


def read_episodes(run_dir: Path, kind: str, step: int | None) -> tuple[int, list[dict[str, Any]]]:
    """The episodes kept of step (or evaluation) ``step``; None: the latest one kept."""
    if not (run_dir / TRANSCRIPTS_DIR).is_dir():
        raise ShowError(
            f"{run_dir} holds no {TRANSCRIPTS_DIR}/: name a run's output_dir, after its first step or "
            "evaluation (runs keep transcripts unless transcripts.per_step and per_eval are 0)"
        )
    steps = kept(run_dir, kind)
    if step is None and not steps:
        raise ShowError(f"{run_dir} kept no {kind} transcripts yet")
    chosen = steps[-1] if step is None else step
    if chosen not in steps:
        label = "steps" if kind == "step" else "evaluations after steps"
        raise ShowError(f"no transcripts of {kind} {chosen} in {run_dir}; kept: {label} {_listed(steps)}")
    episodes = []
    path = run_dir / TRANSCRIPTS_DIR / f"{kind}-{chosen:04d}.jsonl"
    for line in path.read_text().splitlines():
        try:
            episodes.append(json.loads(line))
        except ValueError:  # a line being written
            continue
    return chosen, episodes


def ordered(episodes: list[dict[str, Any]], order: str | None) -> list[dict[str, Any]]:
    """By reward: "worst" first (failed rollouts, which have none, before any), or "best" first."""
    if order is None:
        return episodes

    def reward(episode: dict[str, Any]) -> float:
        value = episode.get("reward")
        return value if isinstance(value, int | float) and math.isfinite(value) else -math.inf

    return sorted(episodes, key=reward, reverse=order == "best")


def kept_note(episodes: list[dict[str, Any]], kind: str) -> str:
    """Why these episodes were kept (`` (4 picked by the seed, and the step's best and worst by
    reward)``); "" for a run that did not record it."""
    reasons = [episode["kept"] for episode in episodes if isinstance(episode.get("kept"), list)]
    if not reasons:
        return ""
    drawn = sum("sample" in reason for reason in reasons)
    extremes = [name for name in ("best", "worst") if any(name in reason for reason in reasons)]
    whose = "step" if kind == "step" else "evaluation"
    also = f", and the {whose}'s {' and '.join(extremes)} by reward" if extremes else ""
    return f" ({drawn} picked by the seed{also})"


def render_episode(episode: dict[str, Any]) -> str:
    """One episode: its header, every message with its role, tool calls, tool results, the failure."""
    reward = episode.get("reward")
    header = [
        f"{episode.get('kind', 'step')} {episode.get('step')}",
        episode.get("row_name") or f"row {episode.get('row_index')}",
        f"group {episode.get('group')}",
        f"reward {reward:.4f}" if isinstance(reward, int | float) else "no reward",
        str(episode.get("status")),
    ]
    header += [f"{reason} of the {episode.get('kind', 'step')}" for reason in _extreme(episode)]
    lines = ["=== " + " · ".join(header) + " ==="]
    metrics = episode.get("metrics") or {}
    if metrics:
        lines.append("metrics: " + ", ".join(f"{name} {value:g}" for name, value in metrics.items()))
    if episode.get("prompt_text"):
        lines += ["[prompt, decoded from its tokens]", _indent(episode["prompt_text"])]
        calls = episode.get("calls") or []
        if calls:
            lines += _message_lines({"role": "assistant", **calls[-1]})
    for message in episode.get("messages") or []:
        lines += _message_lines(message)
    calls = episode.get("calls") or []
    for call in calls[:-1]:
        # The conversation above is the last call's; what the model answered earlier is shown as it
        # sampled it, since an agent may keep something else in its history.
        lines.append(
            f"(earlier: model call {call.get('index')} as sampled, {call.get('completion_tokens')} tokens "
            f"on adapter v{call.get('adapter_version')}, {call.get('finish_reason')})"
        )
        lines += _message_lines({"role": "assistant", **call})[1:]
    unparsed = sum(bool(call.get("unparsed_tool_call")) for call in calls)
    lines.append(f"model calls: {len(calls)}; unparsed tool calls: {unparsed}")
    failure = episode.get("failure")
    if failure:
        lines.append(f"FAILED ({failure.get('cause')}): {failure.get('error') or '(no error text)'}")
    return "\n".join(lines)


def _extreme(episode: dict[str, Any]) -> list[str]:
    """ "best" and/or "worst" where the episode was kept as its step's best or worst."""
    kept = episode.get("kept")
    return [reason for reason in ("best", "worst") if isinstance(kept, list) and reason in kept]


def _message_lines(message: dict[str, Any]) -> list[str]:
    role = message.get("role", "?")
    label = f"[{role}]"
    if role == "tool":
        label = f"[tool result{' for ' + message['tool_call_id'] if message.get('tool_call_id') else ''}]"
    lines = [label]
    text = _text(message.get("content"))
    if text:
        lines.append(_indent(text))
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        lines.append(f"  -> tool call {function.get('name')}({function.get('arguments', '')})")
    if message.get("unparsed_tool_call"):
        lines.append("  (looks like a tool call, but the server parsed none out of it)")
    return lines


def _text(content: Any) -> str:
    """A message's content: a string, or its parts (text as it is, an image by its hash)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, dict):
                parts.append(f"<{part.get('type', 'part')}>")
        return "\n".join(parts)
    return json.dumps(content)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines() or [""])


def _listed(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) if steps else "none"


def _export(args: argparse.Namespace) -> int:
    from trainer.ops.demos import DemosError, export_demos

    if args.min_reward is None:
        print("rft show: --export-demos needs --min-reward X, the lowest reward an episode kept has")
        return 2
    kind, step = ("eval", args.eval) if args.eval is not None else ("step", args.step)
    try:
        print(export_demos(args.run_dir, args.export_demos, args.min_reward, kind, step))
    except DemosError as error:
        print(f"rft show: {error}")
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rft show", description="Print the episodes a run kept: what the model saw and did."
    )
    parser.add_argument("run_dir", type=Path, help="the run's output_dir")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, help="a training step's episodes (default: the latest kept)")
    which.add_argument("--eval", type=int, metavar="STEP", help="the evaluation after step STEP (0: before)")
    order = parser.add_mutually_exclusive_group()
    order.add_argument(
        "--worst", action="store_const", const="worst", dest="order", help="lowest reward first"
    )
    order.add_argument(
        "--best", action="store_const", const="best", dest="order", help="highest reward first"
    )
    parser.add_argument("-n", type=int, default=0, metavar="K", help="show at most K episodes (0: all kept)")
    parser.add_argument(
        "--export-demos",
        type=Path,
        metavar="FILE",
        help="write the kept episodes with a reward of at least --min-reward as `rft sft --data` "
        "demonstrations (JSONL, docs/sft.md) instead of printing; all steps and evaluations unless "
        "--step or --eval names one",
    )
    parser.add_argument("--min-reward", type=float, help="with --export-demos: the lowest reward kept")
    args = parser.parse_args(argv)
    if args.export_demos is not None:
        return _export(args)
    kind, step = ("eval", args.eval) if args.eval is not None else ("step", args.step)
    if args.step is None and args.eval is None and not kept(args.run_dir, "step"):
        kind = "eval"  # in the first evaluation, or a run that keeps no step's episodes
    try:
        step, episodes = read_episodes(args.run_dir, kind, step)
    except ShowError as error:
        print(f"rft show: {error}")
        return 2
    shown = ordered(episodes, args.order)
    shown = shown[: args.n] if args.n > 0 else shown
    note = kept_note(episodes, kind)
    print(f"{args.run_dir}: {len(shown)} of the {len(episodes)} episodes kept of {kind} {step}{note}\n")
    print("\n\n".join(render_episode(episode) for episode in shown))
    return 0
