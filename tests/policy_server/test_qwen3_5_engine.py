"""The hf engine serves the hybrid Qwen 3.5 (Gated DeltaNet linear attention beside full attention):
its cache holds each linear layer's conv and recurrent states, rows join and leave per row, a seeded
request samples the same tokens alone or in any batch, and the logprobs are the learner's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from policy_server.engines.base import GenerationRequest, GenerationResult
from policy_server.engines.hf import HFEngine
from policy_server.engines.hf_batch import GrowingLayer, RecurrentLayer, new_cache
from policy_server.models.families import family
from trainer.algo.grpo import token_logprobs
from trainer.learner.base_load import load_for_training

TARGET = 5  # the request followed alone and in batches: the shortest prompt, so the most padded


@pytest.fixture(scope="module")
def qwen3_5_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return family("qwen3_5").build_tiny(tmp_path_factory.mktemp("tiny-qwen3-5") / "model")


@pytest.fixture(scope="module")
def adapter(qwen3_5_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random LoRA on every linear module, the linear-attention projections included."""
    torch.manual_seed(5)
    config = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(qwen3_5_dir), config)
    out = tmp_path_factory.mktemp("adapter") / "lora"
    model.save_pretrained(out)
    return out


def _request(index: int, seed: int, max_tokens: int = 10) -> GenerationRequest:
    # Prompts of 10 to over 100 tokens: a short one in a batch is padded across the delta rule's chunks.
    text = f"Weather {index}? " + "Paris and Oslo. " * (8 * (index % 5))
    return GenerationRequest(
        messages=[{"role": "user", "content": text}],
        max_tokens=max_tokens,
        temperature=1.0,
        seed=seed,
        adapter_version=1,
    )


async def _serve(engine: HFEngine) -> tuple[GenerationResult, list[GenerationResult], list[GenerationResult]]:
    """The target alone, in one batch with five others, and joining four running rows that finish
    (leave) at different steps."""
    alone = await engine.generate(_request(TARGET, 42))
    others = [_request(i, 100 + i, max_tokens=2 + 2 * i) for i in range(5)]
    batched = await asyncio.gather(*map(engine.generate, [*others, _request(TARGET, 42)]))
    running = [asyncio.create_task(engine.generate(_request(i, 200 + i, 6 + 3 * i))) for i in range(4)]
    start = engine.stats.decode_passes
    while engine.stats.decode_passes < start + 2:
        await asyncio.sleep(0.001)
    assert not any(task.done() for task in running), "the target must join rows still running"
    joined = await asyncio.gather(engine.generate(_request(TARGET, 42)), *running)
    return alone, list(batched), list(joined)


def _run(model_dir: Path, adapter: Path, **options: Any) -> tuple[Any, ...]:
    async def main() -> tuple[Any, ...]:
        engine = HFEngine(model_dir, **options)
        await engine.start()
        try:
            await engine.load_adapter(1, str(adapter))
            return (*await _serve(engine), engine.stats)
        finally:
            await engine.close()

    return asyncio.run(main())


def _learner_logprobs(model: Any, result: GenerationResult) -> torch.Tensor:
    """What the learner recomputes for a sampled completion: one teacher-forced pass."""
    ids = torch.tensor([result.prompt_token_ids + result.completion_token_ids])
    with torch.no_grad():
        logprobs = token_logprobs(model(input_ids=ids).logits, ids)
    return logprobs[0, len(result.prompt_token_ids) :]


def test_a_seeded_row_is_the_same_alone_and_in_batches_and_its_logprobs_are_the_learners(
    qwen3_5_dir: Path, adapter: Path
) -> None:
    alone, batched, joined, stats = _run(qwen3_5_dir, adapter)
    assert len(alone.completion_token_ids) == 10
    assert stats.peak_batch_rows >= 5, "the rows never shared a forward pass"
    # Each prompt is prefilled alone (left padding rounds the delta rule otherwise), then decoded
    # in the shared batch.
    assert stats.prefill_passes == stats.requests
    for together in (batched[-1], joined[0]):
        assert together.completion_token_ids == alone.completion_token_ids
        assert together.completion_logprobs == alone.completion_logprobs  # to the last bit

    base, _ = load_for_training(qwen3_5_dir, torch.float32)
    learner = PeftModel.from_pretrained(base, adapter).eval()
    for result in [alone, *batched, *joined]:
        expected = _learner_logprobs(learner, result)
        diff = (torch.tensor(result.completion_logprobs) - expected).abs().max().item()
        assert diff <= 1e-4, f"max |logprob diff| {diff}"


def test_without_batch_invariance_rows_prefill_together_and_still_match_the_learner(
    qwen3_5_dir: Path, adapter: Path
) -> None:
    alone, batched, joined, stats = _run(qwen3_5_dir, adapter, batch_invariant=False)
    # Requests that arrive together share a left-padded prefill (the invariant engine prefills each alone).
    assert stats.prefill_passes < stats.requests
    base, _ = load_for_training(qwen3_5_dir, torch.float32)
    learner = PeftModel.from_pretrained(base, adapter).eval()
    for result in [alone, *batched, *joined]:
        diff = (torch.tensor(result.completion_logprobs) - _learner_logprobs(learner, result)).abs().max()
        assert diff.item() <= 1e-4


def test_left_padding_leaves_the_linear_state_at_zero(qwen3_5_dir: Path) -> None:
    """Padded positions feed zeros into a zero state, which stays zero: a prompt padded by a whole
    chunk of the delta rule (64) ends in the same states to the bit; padded by 5 the chunks group it
    otherwise and it ends in the same states up to rounding (here ~1e-13 apart), which is why the
    batch-invariant engine prefills such a model one prompt at a time."""
    model = AutoModelForCausalLM.from_pretrained(qwen3_5_dir).eval()
    prompt = torch.arange(10, 33)[None]

    def states(pad: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.cat([torch.full((1, pad), 2), prompt], dim=1)
        mask = torch.cat([torch.zeros(1, pad, dtype=torch.long), torch.ones_like(prompt)], dim=1)
        cache = new_cache(model.config)
        with torch.no_grad():
            model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                cache=cache,
            )
        assert [type(layer) for layer in cache.layers] == [RecurrentLayer, GrowingLayer]
        return cache.layers[0].conv_states[0], cache.layers[0].recurrent_states[0]

    alone, chunk, five = states(0), states(64), states(5)
    assert all(torch.equal(a, b) for a, b in zip(alone, chunk, strict=True))
    assert torch.equal(alone[0], five[0]) and torch.allclose(alone[1], five[1], atol=1e-6)
