"""What one GRPO step records: rewards, rollouts, failures by cause, dropped groups, tokens, dollars,
the update's metrics and the evaluation, as ``metrics.jsonl`` and MLflow show them."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from policy_server import TokenCounters
from trainer.algo.sequences import count_train_tokens
from trainer.batch import StepBatch
from trainer.config import TrainConfig
from trainer.errors import TrainingError
from trainer.fidelity import split_update_metrics, step_fidelity
from trainer.ops.metrics import TokenCost
from trainer.rollouts.evaluation import EvalResult
from trainer.rollouts.outcomes import FailureCounts, mean_agent_metrics
from trainer.rollouts.producer import PlayedRollout
from trainer.run import Run, logged_stop
from trainer.update import StepUpdate

log = logging.getLogger(__name__)


@dataclass
class Sampled:
    """A step's played rollouts, how long they took and how far behind the policy they sampled."""

    played: list[PlayedRollout]
    num_groups: int
    seconds: float  # from the first rollout's start to the last one's end
    wait_s: float  # how long the step waited for them
    staleness: dict[str, float]


def step_record(
    run: Run, sampled: Sampled, batch: StepBatch, update: StepUpdate, evaluation: EvalResult | None
) -> dict[str, Any]:
    """The step's record, but for its timings."""
    tokens = count_tokens(run, update, sampled.played, int(batch.distillation.get("teacher_tokens", 0)))
    record = _rollout_record(run.config, sampled.played, batch, tokens, run.totals, sampled.seconds)
    update_metrics, token_figures = split_update_metrics(update.metrics)
    record["update"] = {"applied": update.applied, **update_metrics}
    record["fidelity"] = step_fidelity(token_figures, sampled.played)
    record["adapter_version"] = run.state.adapter_version
    record["staleness"] = sampled.staleness
    if batch.distillation:
        record["distillation"] = batch.distillation
    replica_stats = getattr(run.session.server.engine, "replica_stats", None)
    if replica_stats is not None:  # inference replicas on Ray: calls per replica, failovers, restarts
        record["replicas"] = replica_stats()
    if evaluation is not None:
        record["eval"] = evaluation.as_dict()
    return record


def _rollout_record(
    config: TrainConfig,
    played: list[PlayedRollout],
    batch: StepBatch,
    tokens: dict[str, int],
    totals: dict[str, int],
    rollout_s: float,
) -> dict[str, Any]:
    """Rewards, rollouts, failures by cause, dropped groups, tokens and dollars of one step."""
    failures = FailureCounts()
    failures.add(rollout.outcome for rollout in played)
    rewards = batch.rewards
    token_counts = count_train_tokens(batch.traces)
    return {
        "reward_mean": math.fsum(rewards) / len(rewards) if rewards else float("nan"),
        "reward_std": float(torch.tensor(rewards).std()) if len(rewards) > 1 else 0.0,
        "success_rate": (
            sum(reward > config.success_threshold for reward in rewards) / len(rewards)
            if rewards
            else float("nan")
        ),
        "rollouts": {
            "total": len(played),
            "ok": sum(rollout.outcome.ok for rollout in played),
            "failed": failures.total,
            "bad_trace": batch.bad_traces,
            "without_sequences": batch.without_sequences,
            "per_s": len(played) / rollout_s if rollout_s > 0 else 0.0,
        },
        "failures": failures.as_dict(),
        "failure_errors": failures.errors_dict(),
        "agent_metrics": mean_agent_metrics([rollout.outcome for rollout in played]),
        "groups": {
            "total": len({rollout.request.group_index for rollout in played}),
            "dropped": batch.dropped_groups,
        },
        # Versions as the policy server numbered them (its numbering restarts on resume).
        "sampled_adapter_versions": sorted(
            {call.adapter_version for rollout in played for call in rollout.trace.calls}
        ),
        "tokens": {
            **tokens,
            "train_per_call": token_counts.per_call,
            "merge_ratio": token_counts.ratio,
            **{f"{key}_total": value for key, value in totals.items()},
        },
        "cost_usd_total": TokenCost(
            totals["prefill"], totals["sample"], totals["train"], config.prices
        ).dollars,
    }


def count_tokens(
    run: Run, update: StepUpdate, played: list[PlayedRollout], teacher_tokens: int = 0
) -> dict[str, int]:
    """The step's prefill and sample tokens (evaluations included) and train tokens; totals move on.

    ``teacher_tokens``: what a distillation teacher read to score the step's sequences, counted as
    prefill (a forward pass over given tokens) and also shown alone as ``teacher_prefill``.

    Synchronous: what the server counted since the last step. Asynchronous: the server meanwhile also
    sampled for later steps, as far as timing let it, so the step's own rollouts' traces are counted
    (and the evaluations' since the last step), which a repeated run counts the same.
    """
    counters = run.session.server.counters(run.session.job_arn)
    if run.config.max_off_policy_steps == 0:
        prefill = counters.prefill_tokens - run.counted.prefill_tokens
        sample = counters.sample_tokens - run.counted.sample_tokens
    else:
        evaluated, run.session.eval_tokens = run.session.eval_tokens, TokenCounters()
        prefill = evaluated.prefill_tokens + sum(
            len(c.prompt_token_ids) for r in played for c in r.trace.calls
        )
        sample = evaluated.sample_tokens + sum(
            len(c.completion_token_ids) for r in played for c in r.trace.calls
        )
    prefill += teacher_tokens
    tokens = {"prefill": prefill, "sample": sample, "train": int(update.metrics.get("train_tokens", 0))}
    run.counted = counters
    run.totals = {key: run.totals[key] + tokens[key] for key in run.totals}
    return {**tokens, "teacher_prefill": teacher_tokens} if teacher_tokens else tokens


# Characters of a failure's first error text in a step's progress line.
POSTFIX_ERROR_CHARS = 120


def failed_postfix(record: dict[str, Any]) -> dict[str, str]:
    """The step's failed rollouts for its progress line: how many of how many, the first cause with
    its first error text and row; nothing when none failed."""
    rollouts = record.get("rollouts", {})
    if not rollouts.get("failed"):
        return {}
    cause, text = next(iter(record.get("failure_errors", {}).items()), ("failed", ""))
    return {"failed": f"{rollouts['failed']}/{rollouts.get('total')} {cause}: {text[:POSTFIX_ERROR_CHARS]}"}


def check_failures(step: int, played: list[PlayedRollout]) -> None:
    """Show failed rollouts' causes with their first error text; stop a run whose rollouts all failed."""
    failures = FailureCounts()
    failures.add(rollout.outcome for rollout in played)
    if not failures.total:
        return
    if failures.total == len(played):
        raise logged_stop(
            TrainingError(
                f"step {step}: all {len(played)} rollouts failed, so there is nothing to train on: "
                f"{failures.describe().rstrip('.')}. The agents' own logs have the details."
            )
        )
    log.warning(
        "step %d: %d of %d rollouts failed: %s", step, failures.total, len(played), failures.describe()
    )
