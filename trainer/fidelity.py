"""Each step's training/sampling fidelity: how far the learner's view of the sampled tokens is from
the sampler's, and whether the step's calls merged and parsed as they should; past a ``fidelity``
limit the run stops with the likely cause (docs/fidelity.md).

The token figures are the learner's first optimizer pass (:mod:`trainer.algo.fidelity`, over the
step's trained tokens); the call figures come from the step's recorded traces.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policy_server.models.families import Parsers
from trainer.algo.fidelity import FIDELITY_PREFIX
from trainer.algo.sequences import prefix_breaks
from trainer.config import FidelityConfig
from trainer.errors import TrainingError
from trainer.rollouts.producer import PlayedRollout

# The learner's fidelity metrics (without their prefix) under the names a step record gives them.
_TOKEN_FIGURES = {
    "abs_diff_mean": "logprob_abs_diff_mean",
    "abs_diff_max": "logprob_abs_diff_max",
    "sequence_abs_diff_max": "worst_sequence_abs_diff",
    "ratio_mean": "ratio_mean",
    "ratio_min": "ratio_min",
    "ratio_max": "ratio_max",
    "outside_clip_fraction": "outside_clip_fraction",
}

_LOGPROB_CAUSE = (
    "the learner does not score the sampled tokens as the engine that sampled them did: most likely it "
    "loads another model, revision or tokenizer than the engine serves, a chat template that differs "
    "between engine and learner, or another dtype/precision (a bf16 or quantised engine against an "
    "fp32 learner)"
)
_PREFIX_CAUSE = (
    "most likely the chat template renders earlier turns differently when they come back (a template "
    "that differs from the one the conversation was sampled with, reasoning dropped, tool calls "
    "reformatted) or the agent edits or re-tokenises its history"
)
_TOOL_CALL_CAUSE = (
    "most likely the engine's tool-call parser does not match the model's tool-call format (vllm "
    "tool_call_parser, or a chat template whose tool section differs from what the model writes)"
)


def _tool_call_cause(parsers: Parsers | None) -> str:
    """Why calls went unparsed, naming the family, the parser in use and the one it expects."""
    if parsers is None:
        return _TOOL_CALL_CAUSE
    expected = parsers.family.vllm_tool_call_parser if parsers.family is not None else parsers.tool_call
    if expected != parsers.tool_call:
        return f"{parsers.describe_tool_calls()}, so the model's calls stay in the text"
    return (
        f"{parsers.describe_tool_calls()} too: most likely the policy writes calls that parser cannot "
        "read (a policy still learning the format), or a chat template whose tool section differs "
        "from the family's teaches it another format"
    )


def _truncation_cause(fidelity: dict[str, Any]) -> str:
    """Why calls were cut off before answering, and where the first ones are."""
    where = "; ".join(fidelity.get("truncated_where") or [])
    return (
        "max_completion_length ends them while the model still reasons: raise max_completion_length, "
        "or set a lower reasoning_effort where the model's family has one (rft plan says what its "
        "reasoning needs)" + (f"; cut off: {where}" if where else "")
    )


def split_update_metrics(metrics: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """The update's metrics without the learner's fidelity figures, and those figures renamed."""
    update = {key: value for key, value in metrics.items() if not key.startswith(FIDELITY_PREFIX)}
    figures = {
        name: metrics[FIDELITY_PREFIX + key]
        for key, name in _TOKEN_FIGURES.items()
        if FIDELITY_PREFIX + key in metrics
    }
    return update, figures


def step_fidelity(token_figures: dict[str, float], played: Sequence[PlayedRollout]) -> dict[str, Any]:
    """A step record's ``fidelity``: the learner's token figures (absent when nothing was trained),
    prefix breaks over continuation calls, unparsed tool calls, and calls cut off by the token limit
    (all of them, those cut off before any answer, and where the first few are)."""
    traces = [rollout.trace for rollout in played]
    calls = sum(len(trace.calls) for trace in traces)
    continuations = sum(max(len(trace.calls) - 1, 0) for trace in traces)
    breaks = sum(prefix_breaks(trace) for trace in traces)
    unparsed = sum(call.unparsed_tool_call for trace in traces for call in trace.calls)
    cut = [(rollout, call) for rollout in played for call in rollout.trace.calls if call.truncated]
    unanswered = sum(not call.answered for _, call in cut)
    return {
        **token_figures,
        "prefix_breaks": breaks,
        "prefix_break_fraction": breaks / continuations if continuations else 0.0,
        "unparsed_tool_calls": unparsed,
        "unparsed_tool_call_fraction": unparsed / calls if calls else 0.0,
        "truncated_calls": len(cut),
        "truncated_call_fraction": len(cut) / calls if calls else 0.0,
        "truncated_unanswered_calls": unanswered,
        "truncated_unanswered_fraction": unanswered / calls if calls else 0.0,
        "truncated_where": [_where(rollout, call.index) for rollout, call in cut[:TRUNCATED_SHOWN]],
        "calls": calls,
    }


# Truncated calls a step record names (row, rollout, call); the counts cover them all.
TRUNCATED_SHOWN = 5


def _where(rollout: PlayedRollout, call_index: int) -> str:
    """Where a call is, for the user to find it: its dataset row, rollout and call number.

    The rollout is named without the random suffix its id ends with (``s1-g0-2-<8 hex>``: the suffix
    keeps ids unique across runs, trainer/session.py), so the same seed gives the same step record;
    the rest (step, group, member) is unique within a run and prefixes the id in transcripts."""
    row = rollout.request.row_name or f"group {rollout.request.group_index}"
    return f"{row}, rollout {rollout.request.rollout_id.rsplit('-', 1)[0]}, call {call_index}"


def check_fidelity(
    config: FidelityConfig, step: int, fidelity: dict[str, Any], parsers: Parsers | None = None
) -> None:
    """Raise :class:`TrainingError` when the step's figures pass a limit of ``config``; ``parsers``
    (the engine's) name the parser in use and the one the model's family expects when tool calls
    went unparsed."""
    if not config.enabled or step < config.check_from_step:
        return
    mismatch, tool_call_cause = "training does not see what sampling did", _tool_call_cause(parsers)
    checks = (
        ("logprob_abs_diff_mean", "max_mean_abs_logprob_diff", mismatch, _LOGPROB_CAUSE),
        ("worst_sequence_abs_diff", "max_worst_sequence_abs_logprob_diff", mismatch, _LOGPROB_CAUSE),
        ("prefix_break_fraction", "max_prefix_break_fraction", mismatch, _PREFIX_CAUSE),
        ("unparsed_tool_call_fraction", "max_unparsed_tool_call_fraction", mismatch, tool_call_cause),
        (
            "truncated_unanswered_fraction",
            "max_truncated_unanswered_fraction",
            "sampling cuts calls off before they answer",
            _truncation_cause(fidelity),
        ),
    )
    for figure, setting, headline, cause in checks:
        limit = getattr(config, setting)
        value = fidelity.get(figure)
        if limit is not None and value is not None and value > limit:
            raise TrainingError(
                f"step {step}: {headline}: fidelity {figure} is "
                f"{value:.4g}, above fidelity.{setting} ({limit:g}); {cause}. The step's figures are in "
                "metrics.jsonl under 'fidelity' (docs/fidelity.md); fidelity.enabled: false only "
                "measures them."
            )
