"""``rft collect``: a teacher plays the config's agents over its dataset rows; the episodes at or above
a reward become demonstrations for ``rft sft`` (docs/distillation.md).

The agents see the teacher exactly as they see the policy during ``rft train``: the run's gateway
(its key, the rollout headers, one rollout id per episode) and fan-out, with the teacher as the
engine. A local model directory is served by rftkit's own engine (``engine`` of the config, with an
optional LoRA adapter on it); every call of each kept episode is written, multi-turn
(:func:`trainer.ops.demos.episode_demonstrations`), in the format `rft show --export-demos` writes.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.config import TrainConfig
from trainer.engine import local_engine
from trainer.errors import TrainingError
from trainer.ops.demos import episode_demonstrations
from trainer.ops.transcripts import call_view
from trainer.rollouts.dataset import dataset_row_name, derived_seed, prompts, read_rows
from trainer.rollouts.outcomes import FailureCounts
from trainer.rollouts.producer import PlayedRollout
from trainer.scale.choices import preflight
from trainer.session import Session

log = logging.getLogger(__name__)


@dataclass
class CollectSummary:
    """What ``rft collect`` played and wrote."""

    played: int = 0
    kept: int = 0  # episodes at or above the reward, written
    below: int = 0  # scored under the reward
    failed: dict[str, int] = field(default_factory=dict)  # failed episodes by cause
    demonstrations: int = 0  # lines written (calls whose conversation a later call does not carry)
    unusable: int = 0  # kept episodes' calls that cannot be a demonstration (clipped, no messages)
    duplicates: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def describe(self, out: Path, min_reward: float) -> str:
        failed = ", ".join(f"{cause} {count}" for cause, count in sorted(self.failed.items())) or "none"
        return (
            f"played {self.played} episodes: kept {self.kept} (reward >= {min_reward:g}), {self.below} "
            f"under it, failed {sum(self.failed.values())} ({failed}); wrote {self.demonstrations} "
            f"demonstrations to {out} ({self.unusable} calls unusable, {self.duplicates} repeated); "
            f"teacher tokens: prefill {self.prompt_tokens:,}, sample {self.completion_tokens:,}; "
            f"warm-start with: rft sft --data {out}"
        )


def teacher_session(config: TrainConfig, teacher: Path, adapter: Path | None) -> Session:
    """A started gateway with ``teacher`` (a model directory, ``adapter`` on it) as its engine."""
    if config.ray is not None:
        raise TrainingError("rft collect serves the teacher in this process: remove the config's ray section")
    served = config.model_copy(update={"model": str(teacher), "init_adapter": None})
    served, placement = preflight(served, teacher)  # with the plan's choices, as rft train serves
    session = Session(served, local_engine(served, teacher, placement))
    session.start()
    if adapter is not None:
        session.load_adapter(adapter, 1)
    return session


def endpoint_session(config: TrainConfig, url: str, model: str, key: str | None) -> Session:
    """A started gateway that forwards every call to the OpenAI-compatible endpoint ``url`` as ``model``
    with ``key`` (:class:`policy_server.engines.ForwardEngine`); the agents still get the run's key."""
    from policy_server.engines import ForwardEngine

    try:
        engine = ForwardEngine(url, model=model, api_key=key)
    except ValueError as error:
        raise TrainingError(f"--teacher {url}: {error}") from None
    session = Session(config, engine)
    session.start()
    return session


def play_rows(session: Session, config: TrainConfig, episodes: int | None) -> list[PlayedRollout]:
    """``episodes`` episodes (default: one per row), the rows in order and again from the first, each
    sampled at the config's temperature with a seed of its own."""
    rows = prompts(read_rows(config.train_file), config.prompt_column, config.train_file)
    if not rows:
        raise TrainingError(f"train_file {config.train_file} holds no rows: add JSONL rows to it")
    count = len(rows) if episodes is None else episodes
    requests = [
        session.request(
            rows[number % len(rows)],
            f"collect-{number}-{uuid.uuid4().hex[:8]}",
            number,
            temperature=config.temperature,
            seed=derived_seed(config.seed, "collect", number),
            row_name=dataset_row_name(config.train_file, number % len(rows)),
            row_index=number % len(rows),
        )
        for number in range(count)
    ]
    return session.play(requests)


def demonstrations_of(
    played: list[PlayedRollout], min_reward: float, decode: Any
) -> tuple[list[dict[str, Any]], CollectSummary]:
    """The kept episodes' demonstrations (repeats once) and the summary of what was played. A call
    forwarded to an endpoint carries its reply (``answer``); a served one is decoded from its ids."""
    summary = CollectSummary(played=len(played))
    failures = FailureCounts()
    failures.add(rollout.outcome for rollout in played)
    summary.failed = {cause: count for cause, count in failures.as_dict().items() if count}
    lines: list[dict[str, Any]] = []
    seen: set[str] = set()
    for rollout in played:
        calls = rollout.trace.calls
        summary.prompt_tokens += sum(len(call.prompt_token_ids) for call in calls)
        summary.completion_tokens += sum(len(call.completion_token_ids) for call in calls)
        reward = rollout.outcome.reward
        if not rollout.outcome.ok or reward is None:
            continue
        if reward < min_reward:
            summary.below += 1
            continue
        summary.kept += 1
        views = [
            {**(call.answer or call_view(call, decode)), "messages": call.messages, "tools": call.tools}
            for call in calls
        ]
        for line in episode_demonstrations(views):
            key = json.dumps(line, sort_keys=True)
            if line is None:
                summary.unusable += 1
            elif key in seen:
                summary.duplicates += 1
            else:
                seen.add(key)
                lines.append(line)
    summary.demonstrations = len(lines)
    return lines, summary
