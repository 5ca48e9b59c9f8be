"""The learner's chunked attention (policy_server/models/chunked_attention.py): gpt-oss trains with
it, and its logprobs and LoRA gradients are eager attention's, past the sliding window, with sinks,
padding and grouped-query heads, while autograd keeps no [T, T] scores."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from policy_server.models import register_training_attention
from policy_server.models.chunked_attention import (
    ATTENTION_NAME,
    QUERY_CHUNK,
    ChunkedAttentionError,
    chunked_attention,
)
from policy_server.models.families import family, family_of
from policy_server.models.tiny_gpt_oss import SLIDING_WINDOW
from trainer.algo.sequences import TrainingSequence
from trainer.config import TrainConfig
from trainer.learner.learner import Learner

# Two rows, right-padded: both past the 128-token window, the longer over two query blocks.
LENGTHS = (300, 170)


@pytest.fixture(scope="module")
def tiny_gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return family("gpt_oss").build_tiny(tmp_path_factory.mktemp("tiny-gpt-oss") / "model")


def _learner(model_dir: Path, **learner: object) -> Learner:
    config = TrainConfig.model_validate(
        {"lora": {"r": 4, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}, "learner": learner}
    )
    model = Learner(model_dir, config)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.model.named_parameters():
            # LoRA's B starts at zero (so A's gradient would be 0) and the sinks near 0: make both
            # count, as after training.
            if "lora_B" in name or name.endswith("sinks"):
                param.copy_(
                    torch.randn(param.shape, generator=generator) * (1.0 if "sinks" in name else 0.05)
                )
    return model


def _sequences(vocab: int) -> list[TrainingSequence]:
    rng = random.Random(0)
    sequences = []
    for index, length in enumerate(LENGTHS):
        mask = [0] * 20 + [1] * (length - 20)
        sequences.append(
            TrainingSequence(
                rollout_id=f"r{index}",
                token_ids=[rng.randrange(vocab) for _ in range(length)],
                loss_mask=mask,
                behavior_logprobs=[0.0] * length,
                advantage=1.0,
                num_calls=1,
            )
        )
    return sequences


def _logprobs_and_grads(learner: Learner, attention: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    learner.model.get_base_model().set_attn_implementation(attention)
    learner.model.zero_grad()
    batch, _ = learner.batch_inputs(_sequences(learner.model.config.vocab_size))
    logprobs, _ = learner.token_logprobs(batch)
    (-(logprobs * batch.loss_mask).sum() / batch.loss_mask.sum()).backward()
    grads = {
        name: param.grad.clone() for name, param in learner.model.named_parameters() if param.grad is not None
    }
    return logprobs.detach() * batch.loss_mask, grads


@pytest.mark.parametrize("checkpointing", [False, True])
def test_gpt_oss_trains_with_the_chunked_attention_and_eagers_numbers(
    tiny_gpt_oss: Path, checkpointing: bool
) -> None:
    learner = _learner(tiny_gpt_oss, gradient_checkpointing=checkpointing)
    assert family_of(tiny_gpt_oss).train_attn_implementation == ATTENTION_NAME
    assert learner.base_load.attn_implementation == ATTENTION_NAME
    layers = learner.model.get_base_model().config.layer_types
    assert "sliding_attention" in layers and max(LENGTHS) > SLIDING_WINDOW and max(LENGTHS) > QUERY_CHUNK

    chunked, chunked_grads = _logprobs_and_grads(learner, ATTENTION_NAME)
    eager, eager_grads = _logprobs_and_grads(learner, "eager")

    assert chunked.abs().sum() > 0
    assert torch.allclose(chunked, eager, rtol=0, atol=1e-5), (chunked - eager).abs().max()
    lora = sorted(name for name in eager_grads if "lora_" in name)
    assert sorted(name for name in chunked_grads if "lora_" in name) == lora
    assert any("lora_A" in name for name in lora) and all(eager_grads[name].abs().sum() > 0 for name in lora)
    for name in lora:
        assert torch.allclose(chunked_grads[name], eager_grads[name], rtol=1e-5, atol=1e-7), name


@contextmanager
def _largest_saved() -> Iterator[list[int]]:
    """The element counts of the tensors autograd saves for the backward, meanwhile."""
    sizes: list[int] = []

    def pack(tensor: torch.Tensor) -> Any:
        sizes.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield sizes


def _attention_inputs(rows: int, heads: int, kv_heads: int, length: int, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shapes = [(rows, heads, length, 16), (rows, kv_heads, length, 16), (rows, kv_heads, length, 16), (heads,)]
    return [torch.randn(shape, generator=generator).requires_grad_() for shape in shapes]


class _Layer(torch.nn.Module):
    """What transformers' gpt-oss eager attention reads from its module."""

    def __init__(self, heads: int, kv_heads: int, sinks: torch.Tensor) -> None:
        super().__init__()
        self.num_key_value_groups = heads // kv_heads
        self.sinks = sinks


def test_autograd_keeps_no_t_by_t_scores_where_eager_keeps_them_per_head() -> None:
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    rows, heads, length = 1, 4, 4 * QUERY_CHUNK
    query, key, value, sinks = _attention_inputs(rows, heads, 2, length)
    with _largest_saved() as chunked_saved:
        chunked_attention(_Layer(heads, 2, sinks), query, key, value, None, scaling=0.25, s_aux=sinks)[
            0
        ].sum()
    with _largest_saved() as eager_saved:
        eager_attention_forward(_Layer(heads, 2, sinks), query, key, value, None, scaling=0.25)[0].sum()

    assert max(eager_saved) >= rows * heads * length * length
    # Nothing larger than the layer's own queries (rows x heads x T x dim): linear in T.
    assert 0 < max(chunked_saved) <= query.numel() < rows * heads * length * length


def test_left_padding_and_queries_after_a_cache_are_eagers_too() -> None:
    """Queries that are the last of the keys (a cache's layout), rows padded on the left."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    heads, kv_heads, keys, queries, window = 4, 1, 200, 150, 40
    query, key, value, sinks = _attention_inputs(2, heads, kv_heads, keys, seed=3)
    query = query[:, :, -queries:]
    padding = torch.ones(2, keys, dtype=torch.bool)
    padding[1, :30] = False
    query_at = torch.arange(keys - queries, keys)[:, None]
    key_at = torch.arange(keys)[None, :]
    allowed = (key_at <= query_at) & (key_at > query_at - window) & padding[:, None, None, :]
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    layer = _Layer(heads, kv_heads, sinks)

    expected, _ = eager_attention_forward(layer, query, key, value, additive, scaling=0.25)
    got, weights = chunked_attention(
        layer, query, key, value, padding, scaling=0.25, sliding_window=window, s_aux=sinks
    )

    assert weights is None and got.shape == expected.shape == (2, queries, heads, 16)
    assert torch.allclose(got, expected, rtol=0, atol=1e-6)


def test_a_mask_pattern_or_dropout_it_does_not_compute_is_refused_with_what_to_do(
    tiny_model_dir: Path, tiny_gpt_oss: Path
) -> None:
    from transformers import AutoModelForCausalLM

    name = register_training_attention(ATTENTION_NAME)
    llama = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation=name
    )
    # Position ids that restart with no attention mask: transformers' Llama reads two packed sequences.
    packed = torch.tensor([[0, 1, 2, 3, 0, 1, 2]])
    with pytest.raises(ChunkedAttentionError, match="attn_implementation 'eager' or 'sdpa' instead"):
        llama(input_ids=torch.ones_like(packed), position_ids=packed, use_cache=False)
    gpt_oss = AutoModelForCausalLM.from_pretrained(
        tiny_gpt_oss, dtype=torch.float32, attn_implementation=name
    )
    gpt_oss.train()
    for layer in gpt_oss.model.layers:
        layer.self_attn.attention_dropout = 0.1
    with pytest.raises(ChunkedAttentionError, match="set the config's attention_dropout to 0"):
        gpt_oss(input_ids=torch.ones(1, 5, dtype=torch.long))


def test_the_plan_counts_the_block_the_attention_computes() -> None:
    """`rft plan` counts the chunked attention's working scores by its name and block size
    (trainer/scale/memory.py keeps them without importing torch): the two must agree."""
    from trainer.scale.memory import BLOCKWISE_ATTENTION

    assert BLOCKWISE_ATTENTION == {ATTENTION_NAME: QUERY_CHUNK}
    assert family("gpt_oss").train_attn_implementation == ATTENTION_NAME
