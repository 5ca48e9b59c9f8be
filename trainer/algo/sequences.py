"""From recorded rollout traces to training sequences, and from sequences to padded tensors.

A multi-turn rollout makes one model call per turn, and each prompt re-reads the whole history.
Training on one sequence per call would train the history again at every turn; instead, a call
whose prompt ids start with the previous call's prompt + completion ids (token for token) extends
that call's sequence: the tokens the environment or template added in between are appended with loss
mask 0, then the new completion with mask 1. A prompt that does not extend (a template that rewrote
history, a truncated context) starts a new sequence. Nothing is re-tokenised: the ids are the ones
the policy server recorded.

Images: a call's :class:`~policy_server.http.images.ImageRef` s place each image on a run of placeholder
tokens of its prompt. Placeholders of two images of one size are the same ids, so a call extends a
sequence only if the images inside the shared prefix are also the same (by sha256, at the same
places); the added part's images join the sequence's list. Positions are the sequence's own, since
a merged prompt starts where the sequence starts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from policy_server import CallRecord, ImageRef, RolloutTrace

if TYPE_CHECKING:
    import torch
    from torch import Tensor


@dataclass
class TrainingSequence:
    """One training sequence: token ids with, per token, whether it is trained and its sampler logprob."""

    rollout_id: str
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)  # 1 on sampled completion tokens
    behavior_logprobs: list[float] = field(default_factory=list)  # sampler's; 0.0 where loss_mask is 0
    adapter_versions: list[int] = field(default_factory=list)  # one per merged call, in order
    advantage: float = 0.0  # set by the trainer from the rollout's group
    # Per-token advantages (one per token, 0 off the loss mask) where on-policy distillation set them;
    # they replace ``advantage`` in the loss.
    token_advantages: list[float] | None = None
    num_calls: int = 0
    images: list[ImageRef] = field(default_factory=list)  # in order; positions in token_ids

    @property
    def num_completion_tokens(self) -> int:
        return sum(self.loss_mask)

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class TrainTokenCounts:
    """Train tokens if calls merge into sequences vs one sequence per call."""

    merged: int
    per_call: int

    @property
    def ratio(self) -> float:
        """merged / per_call; 1.0 when there is nothing to count."""
        return self.merged / self.per_call if self.per_call else 1.0


def _check_call(rollout_id: str, call: CallRecord) -> None:
    if len(call.completion_logprobs) != len(call.completion_token_ids):
        raise ValueError(
            f"rollout {rollout_id!r} call {call.index}: {len(call.completion_logprobs)} logprobs for "
            f"{len(call.completion_token_ids)} completion tokens; the policy server must record one "
            "logprob per sampled token"
        )
    if not call.prompt_token_ids:
        raise ValueError(
            f"rollout {rollout_id!r} call {call.index}: empty prompt; nothing predicts its first token"
        )
    if not all(math.isfinite(lp) for lp in call.completion_logprobs):
        raise ValueError(f"rollout {rollout_id!r} call {call.index}: non-finite completion logprob")


def build_sequences(trace: RolloutTrace) -> list[TrainingSequence]:
    """The training sequences of one rollout, calls merged where the next prompt extends the last sequence.

    Sequences without a single sampled token carry no gradient and are left out. Raises ``ValueError``
    on a malformed call (logprobs not one per completion token, empty prompt, non-finite logprob).
    """
    sequences: list[TrainingSequence] = []
    current: TrainingSequence | None = None
    for call in trace.calls:
        _check_call(trace.rollout_id, call)
        prompt = call.prompt_token_ids
        if current is None or not _extends(current, call):
            current = TrainingSequence(rollout_id=trace.rollout_id)
            sequences.append(current)
        current.images += [ref for ref in call.images if ref.start >= len(current.token_ids)]
        added = prompt[len(current.token_ids) :]
        current.token_ids += added + call.completion_token_ids
        current.loss_mask += [0] * len(added) + [1] * len(call.completion_token_ids)
        current.behavior_logprobs += [0.0] * len(added) + list(call.completion_logprobs)
        current.adapter_versions.append(call.adapter_version)
        current.num_calls += 1
    return [sequence for sequence in sequences if sequence.num_completion_tokens > 0]


def _extends(sequence: TrainingSequence, call: CallRecord) -> bool:
    """Whether ``call``'s prompt starts with ``sequence``: the same ids and the same images in them."""
    length = len(sequence.token_ids)
    if call.prompt_token_ids[:length] != sequence.token_ids:
        return False
    return [ref for ref in call.images if ref.start < length] == sequence.images


def prefix_breaks(trace: RolloutTrace) -> int:
    """Calls of ``trace`` whose prompt ids do not start with the previous call's prompt + completion ids:
    each starts a new training sequence in :func:`build_sequences` (whose last sequence always ends with
    the previous call), so the history is trained again. A template that rewrites earlier turns, or text
    that tokenises differently when rendered back, breaks the prefix; the first call never does."""
    breaks = 0
    for previous, call in zip(trace.calls, trace.calls[1:], strict=False):
        before = previous.prompt_token_ids + previous.completion_token_ids
        breaks += call.prompt_token_ids[: len(before)] != before
    return breaks


def count_train_tokens(traces: Iterable[RolloutTrace]) -> TrainTokenCounts:
    """Tokens a learner processes with merging (all tokens of :func:`build_sequences`) and without it
    (the sum over calls of prompt + completion length)."""
    merged = per_call = 0
    for trace in traces:
        merged += sum(len(sequence) for sequence in build_sequences(trace))
        per_call += sum(len(call.prompt_token_ids) + len(call.completion_token_ids) for call in trace.calls)
    return TrainTokenCounts(merged=merged, per_call=per_call)


@dataclass
class SequenceBatch:
    """Sequences right-padded to one length, ready for a forward pass and
    :func:`trainer.algo.grpo.grpo_loss`."""

    input_ids: Tensor  # [B, T] long
    attention_mask: Tensor  # [B, T] long, 1 on real tokens
    loss_mask: Tensor  # [B, T] float, 1 on sampled tokens
    behavior_logprobs: Tensor  # [B, T] float32, 0 where loss_mask is 0
    advantages: Tensor  # [B] float32, or [B, T] when a sequence carries per-token advantages


def right_pad(
    rows: Sequence[Sequence[int] | Sequence[float] | Tensor],
    fill: float,
    dtype: torch.dtype,
    *,
    width: int | None = None,
    device: torch.device | str = "cpu",
) -> Tensor:
    """Rows of values right-padded with ``fill`` into one ``[len(rows), width]`` tensor (width: the
    longest row's); the repo's one padding routine (GRPO batches, warm-start batches, old logprobs)."""
    import torch

    width = max(len(row) for row in rows) if width is None else width
    padded = torch.full((len(rows), width), fill, dtype=dtype, device=device)
    for index, row in enumerate(rows):
        values = row if isinstance(row, torch.Tensor) else torch.tensor(row, dtype=dtype)
        padded[index, : len(values)] = values.to(padded.device, padded.dtype)
    return padded


def pad_batch(sequences: Sequence[TrainingSequence], pad_token_id: int) -> SequenceBatch:
    """Right-pad ``sequences`` to the longest one; padding has attention 0 and loss mask 0."""
    import torch

    if not sequences:
        raise ValueError("pad_batch needs at least one sequence")
    input_ids = right_pad([sequence.token_ids for sequence in sequences], pad_token_id, torch.long)
    attention_mask = right_pad([[1] * len(sequence) for sequence in sequences], 0, torch.long)
    loss_mask = right_pad([sequence.loss_mask for sequence in sequences], 0, torch.float32)
    behavior = right_pad([sequence.behavior_logprobs for sequence in sequences], 0, torch.float32)
    advantages = torch.tensor([sequence.advantage for sequence in sequences], dtype=torch.float32)
    if any(sequence.token_advantages is not None for sequence in sequences):
        per_token = [
            sequence.token_advantages or [sequence.advantage * mask for mask in sequence.loss_mask]
            for sequence in sequences
        ]
        advantages = right_pad(per_token, 0, torch.float32, width=input_ids.shape[1])
    return SequenceBatch(input_ids, attention_mask, loss_mask, behavior, advantages)


def micro_batches_by_token_budget(
    sequences: Sequence[TrainingSequence], max_tokens: int
) -> list[list[TrainingSequence]]:
    """Split sequences into micro-batches whose padded size (rows x longest row) stays within ``max_tokens``.

    Sequences are taken longest first (a stable sort, so the split is deterministic) so that rows of
    similar length share a micro-batch and padding stays small. A sequence longer than the budget
    gets a micro-batch of its own.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    batches: list[list[TrainingSequence]] = []
    for sequence in sorted(sequences, key=len, reverse=True):
        # The first row of each micro-batch is its longest, so the padded size is rows x first length.
        if batches and (len(batches[-1]) + 1) * len(batches[-1][0]) <= max_tokens:
            batches[-1].append(sequence)
        else:
            batches.append([sequence])
    return batches
