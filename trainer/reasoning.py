"""The run-level ``reasoning_effort``: what the gateway gives every chat call that sends none, refused
at run start for a model family without the switch, and the note ``rft plan`` and ``rft train`` give
when ``max_completion_length`` is below what the family's reasoning takes at the effort in use."""

from __future__ import annotations

from pathlib import Path

from policy_server.models.families import Family, UnknownFamilyError, family_of
from trainer.config import TrainConfig


def reasoning_refusal(config: TrainConfig, family: Family | None) -> str | None:
    """Why ``config.reasoning_effort`` cannot reach the model's template (a sentence), or None. A model
    of no family rftkit knows gets it as a request's own value would: its template's to read."""
    if config.reasoning_effort is None or family is None:
        return None
    refusal = family.reasoning_effort_refusal(config.reasoning_effort)
    if refusal is None:
        return None
    return f"reasoning_effort {config.reasoning_effort!r} cannot be applied to every call: {refusal}"


def reasoning_note(config: TrainConfig, model_dir: str | Path) -> str | None:
    """The sentence saying ``max_completion_length`` is below what the model family's reasoning takes
    at the run's effort (its default when unset), or None (enough, or nothing known)."""
    try:
        family = family_of(model_dir)
    except UnknownFamilyError:
        return None
    if family is None or reasoning_refusal(config, family) is not None:
        return None
    return family.reasoning_budget_note(config.reasoning_effort, config.max_completion_length)
