"""Chunked token logprobs from hidden states equal the whole-logits computation, values and gradients."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from trainer.algo.grpo import entropy_from_logits, token_logprobs
from trainer.algo.logprobs import chunked_token_logprobs, logit_transform


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


def _batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, vocab, (3, 17), generator=generator)
    attention = torch.ones_like(input_ids)
    attention[2, 12:] = 0  # a right-padded row
    mask = torch.zeros(3, 17)
    mask[0, 5:] = 1
    mask[1, 9:15] = 1
    mask[2, 3:12] = 1
    return input_ids, attention, mask


def _whole(model: torch.nn.Module, input_ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    return model(input_ids=input_ids, attention_mask=attention).logits


@pytest.mark.parametrize("chunk_size", [1, 5, 1024])
def test_chunked_equals_whole_logits(model: torch.nn.Module, chunk_size: int) -> None:
    input_ids, attention, mask = _batch(model.config.vocab_size)
    with torch.no_grad():
        logits = _whole(model, input_ids, attention)
        hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention).last_hidden_state
    expected = token_logprobs(logits, input_ids) * mask
    expected_entropy = entropy_from_logits(logits) * mask
    logprobs, entropy = chunked_token_logprobs(
        hidden, model.get_output_embeddings(), input_ids, mask, chunk_size=chunk_size
    )
    # The same float32 arithmetic on a subset of the head's rows. Bit-equal needs the BLAS to reduce
    # each row the same way whatever the row count: on this machine's CPU it does from 64 rows on,
    # while one to a few rows take a matrix-vector kernel that can differ in the last bit (seen:
    # 4.8e-7 at logprobs near -7, one ulp). So: equal to two ulps, and exactly 0 where unmasked.
    # The entropy sums a vocabulary of such terms: equal to a relative 1e-6 (seen: 4.9e-7).
    torch.testing.assert_close(logprobs, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(entropy, expected_entropy, rtol=1e-6, atol=1e-6)
    assert logprobs[mask == 0].abs().sum() == 0 and entropy[mask == 0].abs().sum() == 0


def test_gradients_through_recomputed_chunks_equal_whole_logits(model: torch.nn.Module) -> None:
    input_ids, attention, mask = _batch(model.config.vocab_size)
    weights = torch.linspace(-1.0, 1.0, mask.numel()).reshape(mask.shape)

    def grads(chunked: bool) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        if chunked:
            hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention).last_hidden_state
            logprobs, _ = chunked_token_logprobs(
                hidden, model.get_output_embeddings(), input_ids, mask, chunk_size=4
            )
        else:
            logprobs = token_logprobs(_whole(model, input_ids, attention), input_ids)
        (logprobs * mask * weights).sum().backward()
        return [param.grad.clone() for param in model.parameters()]

    whole, chunked = grads(False), grads(True)
    # The head's weight gradient sums its chunks in another order, and entries near 0 come out of
    # cancellations: equal to 1e-5 of each gradient's largest entry (seen: 7.5e-7 absolute).
    for a, b in zip(whole, chunked, strict=True):
        assert a.abs().max() > 0
        assert (b - a).abs().max() <= 1e-5 * a.abs().max()


def test_no_masked_token_gives_zeros(model: torch.nn.Module) -> None:
    input_ids, attention, mask = _batch(model.config.vocab_size)
    hidden = torch.zeros(3, 17, model.config.hidden_size)
    logprobs, entropy = chunked_token_logprobs(
        hidden, model.get_output_embeddings(), input_ids, torch.zeros_like(mask)
    )
    assert logprobs.shape == (3, 17) and not logprobs.any() and not entropy.any()


def test_soft_capping_follows_the_model_config() -> None:
    class Capped:
        final_logit_softcapping = 30.0

    transform = logit_transform(Capped())
    assert transform is not None and logit_transform(object()) is None
    logits = torch.tensor([[-100.0, 0.0, 15.0, 100.0]])
    expected = 30.0 * torch.tanh(logits / 30.0)
    torch.testing.assert_close(transform(logits), expected)
    head = torch.nn.Identity()
    input_ids = torch.tensor([[0, 2]])
    logprobs, _ = chunked_token_logprobs(
        logits.unsqueeze(0).expand(1, 2, 4), head, input_ids, torch.tensor([[0.0, 1.0]]), transform=transform
    )
    # Capped: about -16.1; uncapped it would be about -85.
    assert logprobs[0, 1] == pytest.approx(float(torch.log_softmax(expected, dim=-1)[0, 2]), abs=1e-5)
