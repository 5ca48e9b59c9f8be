"""Traces to training sequences on hand-made traces: merging, masks, logprob alignment, counts, batching."""

from __future__ import annotations

import pytest
import torch

from policy_server.trace import CallRecord, RolloutTrace
from trainer.algo.grpo import token_logprobs
from trainer.algo.sequences import (
    TrainingSequence,
    build_sequences,
    count_train_tokens,
    micro_batches_by_token_budget,
    pad_batch,
)


def call(
    index: int, prompt: list[int], completion: list[int], logprobs: list[float], version: int = 0
) -> CallRecord:
    return CallRecord(
        index=index,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=logprobs,
        adapter_version=version,
        finish_reason="stop",
        started_at=0.0,
        finished_at=0.0,
    )


def trace(*calls: CallRecord, rollout_id: str = "r1") -> RolloutTrace:
    return RolloutTrace(job_arn="job", rollout_id=rollout_id, calls=list(calls))


# Three turns, each prompt = previous prompt + completion + what the environment added (4, 5 then 6).
EXTENDING = trace(
    call(0, [1, 2, 3], [10, 11], [-0.1, -0.2]),
    call(1, [1, 2, 3, 10, 11, 4, 5], [12], [-0.3]),
    call(2, [1, 2, 3, 10, 11, 4, 5, 12, 6], [13, 14], [-0.4, -0.5], version=1),
)


def test_three_extending_calls_merge_into_one_sequence() -> None:
    (sequence,) = build_sequences(EXTENDING)
    assert sequence.token_ids == [1, 2, 3, 10, 11, 4, 5, 12, 6, 13, 14]
    assert sequence.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1]
    assert sequence.behavior_logprobs == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.3, 0.0, -0.4, -0.5]
    assert sequence.adapter_versions == [0, 0, 1]
    assert sequence.num_calls == 3
    assert sequence.rollout_id == "r1"
    assert sequence.advantage == 0.0


def test_a_prompt_that_does_not_extend_starts_a_new_sequence() -> None:
    # Turn 2's template rewrote history: token 10 became 99 (as when a template drops earlier reasoning).
    rewritten = trace(
        call(0, [1, 2, 3], [10, 11], [-0.1, -0.2]),
        call(1, [1, 2, 3, 99, 11, 4], [12], [-0.3]),
        call(2, [1, 2, 3, 99, 11, 4, 12, 7], [13], [-0.6]),
    )
    first, second = build_sequences(rewritten)
    assert (
        first.token_ids == [1, 2, 3, 10, 11] and first.loss_mask == [0, 0, 0, 1, 1] and first.num_calls == 1
    )
    # the second sequence re-reads the whole rewritten prompt (masked) and then merges turn 3
    assert second.token_ids == [1, 2, 3, 99, 11, 4, 12, 7, 13]
    assert second.loss_mask == [0, 0, 0, 0, 0, 0, 1, 0, 1]
    assert second.behavior_logprobs == [0.0] * 6 + [-0.3, 0.0, -0.6]
    assert second.num_calls == 2


def test_a_prompt_shorter_than_the_sequence_starts_a_new_one() -> None:
    truncated = trace(call(0, [1, 2, 3], [10, 11], [-0.1, -0.2]), call(1, [1, 2, 3, 10], [12], [-0.3]))
    assert [s.token_ids for s in build_sequences(truncated)] == [[1, 2, 3, 10, 11], [1, 2, 3, 10, 12]]


def test_single_call_and_empty_traces() -> None:
    (single,) = build_sequences(trace(call(0, [5, 6], [7], [-1.5], version=3)))
    assert single.token_ids == [5, 6, 7]
    assert single.loss_mask == [0, 0, 1]
    assert single.behavior_logprobs == [0.0, 0.0, -1.5]
    assert single.adapter_versions == [3]
    assert build_sequences(trace()) == []
    # a call that sampled nothing carries no gradient and yields no sequence
    assert build_sequences(trace(call(0, [5, 6], [], []))) == []


def test_malformed_calls_are_rejected_with_the_call_named() -> None:
    with pytest.raises(ValueError, match=r"rollout 'r1' call 1: 1 logprobs for 2 completion tokens"):
        build_sequences(trace(call(0, [1], [2], [-0.1]), call(1, [1, 2, 3], [4, 5], [-0.2])))
    with pytest.raises(ValueError, match="empty prompt"):
        build_sequences(trace(call(0, [], [2], [-0.1])))
    with pytest.raises(ValueError, match="non-finite"):
        build_sequences(trace(call(0, [1], [2], [float("nan")])))


def test_token_counts_merged_and_per_call() -> None:
    rewritten = trace(call(0, [1, 2], [3], [-0.1]), call(1, [1, 9], [4], [-0.2]), rollout_id="r2")
    counts = count_train_tokens([EXTENDING, rewritten])
    # EXTENDING: merged 11; per call (3 + 2) + (7 + 1) + (9 + 2) = 24.  rewritten: 3 + 3 both ways.
    assert counts.merged == 11 + 6
    assert counts.per_call == 24 + 6
    assert counts.ratio == pytest.approx(17 / 30)
    assert count_train_tokens([]).ratio == 1.0


def test_pad_batch_right_pads_with_masks() -> None:
    (short,) = build_sequences(trace(call(0, [5, 6], [7], [-1.5])))
    short.advantage = -0.5
    (long,) = build_sequences(EXTENDING)
    long.advantage = 1.25
    batch = pad_batch([short, long], pad_token_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7] + [0] * 8, long.token_ids]
    assert batch.attention_mask.tolist() == [[1, 1, 1] + [0] * 8, [1] * 11]
    assert batch.loss_mask.tolist() == [[0, 0, 1] + [0] * 8, [float(m) for m in long.loss_mask]]
    torch.testing.assert_close(batch.behavior_logprobs[0], torch.tensor([0.0, 0.0, -1.5] + [0.0] * 8))
    torch.testing.assert_close(batch.behavior_logprobs[1], torch.tensor(long.behavior_logprobs))
    assert batch.advantages.tolist() == [-0.5, 1.25]
    with pytest.raises(ValueError, match="at least one"):
        pad_batch([], pad_token_id=0)


def test_merged_sequence_logprobs_align_with_the_per_call_ones_under_a_causal_model() -> None:
    # Record "sampler" logprobs call by call with a small causal model, as the policy server would, then
    # check that the merged, padded batch gives back exactly those logprobs on its loss-masked tokens.
    generator = torch.Generator().manual_seed(0)
    embedding = torch.randn(16, 4, generator=generator, dtype=torch.float64)
    head = torch.randn(16, 4, generator=generator, dtype=torch.float64)

    def logprobs(ids: torch.Tensor) -> torch.Tensor:
        return token_logprobs(torch.cumsum(embedding[ids], dim=1) @ head.T, ids)

    def recorded(index: int, prompt: list[int], completion: list[int]) -> CallRecord:
        full = logprobs(torch.tensor([prompt + completion]))[0, len(prompt) :].tolist()
        return call(index, prompt, completion, full)

    calls = [recorded(0, [1, 2, 3], [10, 11]), recorded(1, [1, 2, 3, 10, 11, 4, 5], [12, 13])]
    merged = build_sequences(trace(*calls))
    other = build_sequences(trace(recorded(0, [7, 8], [9]), rollout_id="r2"))
    batch = pad_batch(merged + other, pad_token_id=0)
    current = logprobs(batch.input_ids)
    on = batch.loss_mask > 0
    torch.testing.assert_close(current[on].float(), batch.behavior_logprobs[on])


def sequences_of_lengths(*lengths: int) -> list[TrainingSequence]:
    return [
        TrainingSequence(rollout_id=f"r{n}-{i}", token_ids=[1] * n, loss_mask=[1] * n)
        for i, n in enumerate(lengths)
    ]


def test_micro_batches_stay_within_the_padded_token_budget() -> None:
    sequences = sequences_of_lengths(5, 3, 8, 2, 2)
    batches = micro_batches_by_token_budget(sequences, max_tokens=8)
    # longest first: 8 alone; 5 alone (2 x 5 > 8); 3 and 2 (2 x 3 = 6; 3 x 3 = 9 > 8); the last 2 alone
    assert [[len(s) for s in batch] for batch in batches] == [[8], [5], [3, 2], [2]]
    assert sorted(id(s) for batch in batches for s in batch) == sorted(id(s) for s in sequences)
    assert all(len(batch) * max(len(s) for s in batch) <= 8 for batch in batches)


def test_a_sequence_over_the_budget_gets_its_own_micro_batch() -> None:
    batches = micro_batches_by_token_budget(sequences_of_lengths(2, 12, 3), max_tokens=8)
    assert [[len(s) for s in batch] for batch in batches] == [[12], [3, 2]]
    assert micro_batches_by_token_budget([], max_tokens=8) == []
    with pytest.raises(ValueError, match="max_tokens"):
        micro_batches_by_token_budget(sequences_of_lengths(2), max_tokens=0)
