"""Rollouts that never reached the model: their calls refused at the gateway, or none made at all.

An agent commonly catches every error and still answers with its no-play reward; scored, such a
rollout would train on an infrastructure failure (a wrong key, a refused token) as if it were the
policy's play. The gateway records every refusal in the rollout's trace, with the first one's status
and sentence; here such a rollout fails by cause instead, whatever the agent answered.
"""

from __future__ import annotations

import dataclasses

from handlers import FailureCause
from policy_server import RolloutTrace
from trainer.rollouts.outcomes import RolloutOutcome

# Failures that already say what went wrong with the agent itself, before any word of its model calls:
# the agent skipped the row, overran its deadline or could not be reached.
_KEPT_CAUSES = (FailureCause.SKIPPED, FailureCause.TIMEOUT, FailureCause.TRANSPORT)


def check_model_calls(outcome: RolloutOutcome, trace: RolloutTrace) -> RolloutOutcome:
    """The outcome failed by ``model_calls_refused`` (calls made, every one refused) or
    ``no_model_calls`` (no call at all), with the gateway's first refusal as its text.

    A rollout that recorded a call is judged by its answer, whatever else was refused: a refusal
    without credentials is counted against the rollout its headers name, whoever sent it, so it must
    not be able to fail a rollout that plays.
    """
    if outcome.cause in _KEPT_CAUSES:
        return outcome
    refused = trace.rejected_calls + trace.auth_refused_calls
    if refused and not trace.calls:
        error = f"the gateway refused all {refused} of its model calls, first: {trace.first_refusal}"
        return _failed(outcome, FailureCause.MODEL_CALLS_REFUSED, error)
    if not trace.calls and outcome.ok:
        error = (
            "the agent answered without calling the model, so the rollout has no tokens to train on "
            "(its calls must go to the payload's endpoint with the rollout's headers)"
        )
        return _failed(outcome, FailureCause.NO_MODEL_CALLS, error)
    return outcome


def _failed(outcome: RolloutOutcome, cause: FailureCause, error: str) -> RolloutOutcome:
    if outcome.error and not outcome.ok:
        error = f"{error}; the agent said: {outcome.error}"
    return dataclasses.replace(outcome, status="failed", cause=cause, reward=None, rewards=None, error=error)
