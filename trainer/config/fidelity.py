"""The fidelity section (limits on how far training may drift from what sampling did) and the
transcripts section (episodes kept to read what sampling did: `rft show`)."""

from __future__ import annotations

from pydantic import (
    Field,
)

from trainer.config.common import _Section


class FidelityConfig(_Section):
    """Limits on each step's training/sampling agreement (docs/fidelity.md): past one, the run stops."""

    enabled: bool = Field(
        default=True,
        description="Stop the run when a step's fidelity figures pass a limit below. false: the figures "
        "are still measured and logged, never enforced.",
    )
    check_from_step: int = Field(
        default=1, gt=0, description="The first training step whose figures are checked against the limits."
    )
    max_mean_abs_logprob_diff: float | None = Field(
        default=0.1,
        gt=0,
        description="Most mean |sampler logprob - learner logprob| over a step's trained tokens (nats; "
        "the learner's before its first optimizer pass). fp32 runs measure about 2e-7 (hf and vLLM, "
        "docs/fidelity.md); bf16 engines sit higher; a learner scoring with other weights than the "
        "engine's is far above (0.27 between two random tiny models). Unset: not enforced.",
    )
    max_worst_sequence_abs_logprob_diff: float | None = Field(
        default=None,
        gt=0,
        description="Most mean |sampler - learner| logprob of the step's worst training sequence (one "
        "broken sequence hides in the step's mean). Unset: reported, not enforced.",
    )
    max_prefix_break_fraction: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Most share of a step's continuation calls (each rollout's calls after its first) "
        "whose prompt does not extend the previous call's prompt + completion token for token, so they "
        "start a new training sequence. An untrained model's odd samples often re-tokenise differently "
        "when rendered back; unset: reported, not enforced.",
    )
    max_unparsed_tool_call_fraction: float | None = Field(
        default=0.5,
        ge=0,
        le=1,
        description="Most share of a step's calls holding a tool call that did not parse (a tool-call "
        "marker such as <tool_call> left in its content, arguments that do not match the tool's schema, "
        "calls cut off by the token limit): an engine parsing with another parser than the model writes "
        "for leaves nearly every call so. A policy still learning the format writes some (the demos up "
        "to 0.35 of a step, docs/fidelity.md); the stop "
        "names the model's family, the parser in use and the one the family expects. Unset: reported, "
        "not enforced.",
    )
    max_truncated_unanswered_fraction: float | None = Field(
        default=0.5,
        ge=0,
        le=1,
        description="Most share of a step's calls cut off by max_completion_length before they answered "
        "(the reply holds reasoning only, or nothing: no content, no tool call), as a reasoning model "
        "whose reasoning outgrows the limit leaves them; the agent gets nothing to act on. Every call cut "
        "off is counted (truncated_calls, with the first ones' rows); one cut inside a tool call is an "
        "unparsed tool call too. Unset: reported, not enforced.",
    )


class TranscriptsConfig(_Section):
    """Episodes kept as JSONL in `output_dir/transcripts/` for `rft show` (operations.md)."""

    per_step: int = Field(
        default=4,
        ge=0,
        description="Episodes kept of each training step (transcripts/step-NNNN.jsonl), picked by the "
        "seed and the step, so the same seed keeps the same episodes; 0: none; more than the step's "
        "rollouts: all of them. Besides them, the step's best and worst episode by reward.",
    )
    per_eval: int = Field(
        default=4,
        ge=0,
        description="Episodes kept of each evaluation (transcripts/eval-NNNN.jsonl, NNNN the step it "
        "followed), picked by the seed alone: every evaluation keeps the same rows and seeds, so before "
        "and after read side by side; 0: none. Besides them, the evaluation's best and worst episode.",
    )
