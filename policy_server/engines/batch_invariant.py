"""Batch-invariant forward passes: a row's numbers do not depend on which rows share its batch.

The hf engine batches whatever requests are waiting, and which requests those are depends on the
agents' timing. Sampling is seeded per request, so a request samples the same tokens in any batch
only if its logits are the same to the last bit in any batch. Three things break that on a CPU
(``tests/policy_server/test_batch_invariance.py`` checks each; docs/reproducibility.md has the story):

- matrix products with few rows: BLAS computes full tiles of rows with one kernel and a short
  remainder (and a single row, a matrix-vector product) with others that add up in another order.
  Past a few rows (how many depends on the thread count) every row goes through the full-tile kernel;
  :func:`pad_rows` pads the rows of every linear layer (and LoRA embedding) to
  :func:`min_gemm_rows` and drops the padding from the result;
- matrix products of strided rows: the logits of a prefill are taken from each row's last position,
  a view whose rows lie a whole prompt apart, and torch multiplies such a view by another route than
  the same rows stored contiguously (the last bits differ in every row), so a row's first logprob
  would depend on how many prompts arrived with it. :func:`pad_rows` hands every layer contiguous
  rows;
- attention over a left-padded cache: the softmax sum and the weighted sum of values run over the
  padded length, so padding changes how the terms are grouped. :func:`rowwise_attention` attends
  each row over its own keys only (no padding), the same call whether the row is alone or not.

Everything else in a decoder (norms, activations, rotary embeddings, embedding lookups, the
log-softmax of the sampler) works row by row already. This holds on the CPU; on CUDA, cuBLAS picks
kernels by shape and nothing here changes that.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

ATTENTION_NAME = "rftkit_rowwise"

_state = threading.local()


def min_gemm_rows() -> int:
    """Rows every weight product is padded to: enough that each thread gets full BLAS tiles."""
    return max(16, 8 * torch.get_num_threads())


def pad_rows(model: torch.nn.Module, min_rows: int) -> None:
    """Make every ``nn.Linear`` and embedding of ``model`` compute at least ``min_rows`` rows.

    A forward hook pair flattens the input to rows, appends zero rows (token id 0 for embeddings,
    whose LoRA adds a product with a weight matrix) and drops them from the output. It acts only
    inside :func:`row_lengths`, pads only calls with fewer rows and makes the others' input contiguous;
    modules added later (a new adapter's) need another call, which skips the modules already hooked.
    """
    for module in model.modules():
        if getattr(module, "_rftkit_pads_rows", False):
            continue
        if isinstance(module, torch.nn.Linear) or _is_lora_embedding(module):
            module.register_forward_pre_hook(_padding_hook(min_rows))
            module.register_forward_hook(_unpadding_hook)
            module._rftkit_pads_rows = True


def _is_lora_embedding(module: torch.nn.Module) -> bool:
    return hasattr(module, "lora_embedding_A") and isinstance(
        getattr(module, "base_layer", None), torch.nn.Embedding
    )


def _padding_hook(min_rows: int) -> Any:
    def hook(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if getattr(_state, "lengths", None) is None or not args or not isinstance(args[0], torch.Tensor):
            return None
        x = args[0]
        embedding = not torch.is_floating_point(x)
        width = 1 if embedding else x.shape[-1]
        rows = x.numel() // max(width, 1)
        if rows >= min_rows or rows == 0:
            return None if x.is_contiguous() else (x.contiguous(), *args[1:])
        module._rftkit_shape = x.shape
        flat = x.reshape(rows) if embedding else x.reshape(rows, width)
        padding = (0, min_rows - rows) if embedding else (0, 0, 0, min_rows - rows)
        return (F.pad(flat, padding), *args[1:])

    return hook


def _unpadding_hook(module: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> Any:
    shape = getattr(module, "_rftkit_shape", None)
    if shape is None:
        return None
    module._rftkit_shape = None
    embedding = not torch.is_floating_point(args[0])
    rows = shape.numel() if embedding else shape.numel() // shape[-1]
    leading = shape if embedding else shape[:-1]
    return output[:rows].reshape(*leading, output.shape[-1])


@contextmanager
def row_lengths(query_lengths: list[int], key_lengths: list[int]) -> Iterator[None]:
    """Tell :func:`rowwise_attention` each row's real (unpadded) query and key counts for one pass.

    Row ``b``'s queries are the last ``query_lengths[b]`` positions of the pass and its keys the last
    ``key_lengths[b]`` positions of the cache (the engine pads on the left).
    """
    _state.lengths = (query_lengths, key_lengths)
    try:
        yield
    finally:
        _state.lengths = None


def rowwise_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention computed row by row over each row's unpadded keys (transformers' signature).

    ``query`` is ``[batch, heads, q, dim]``, ``key``/``value`` ``[batch, kv_heads, k, dim]``; returns
    ``[batch, q, heads, dim]`` with zeros at padding positions. A layer that passes ``sliding_window``
    (Gemma's, gpt-oss's local layers) lets each query see only that many keys, ending at its own.
    """
    lengths = getattr(_state, "lengths", None)
    if lengths is None:
        raise RuntimeError(
            f"the {ATTENTION_NAME!r} attention needs each row's lengths: run the forward pass inside "
            "batch_invariant.row_lengths(...)"
        )
    query_lengths, key_lengths = lengths
    batch, heads, q_total, dim = query.shape
    gqa = key.shape[1] != heads
    out = query.new_zeros(batch, q_total, heads, dim)
    for row in range(batch):
        n_q, n_k = query_lengths[row], key_lengths[row]
        q = query[row : row + 1, :, q_total - n_q :].contiguous()
        k = key[row : row + 1, :, key.shape[2] - n_k :].contiguous()
        v = value[row : row + 1, :, value.shape[2] - n_k :].contiguous()
        mask = _causal_mask(n_q, n_k, kwargs.get("sliding_window"), q.device)
        if kwargs.get("s_aux") is not None:  # attention sinks (gpt-oss): SDPA has none
            if mask is None and n_q > 1:
                mask = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
            attended = _sink_attention(q, k, v, mask, scaling, kwargs["s_aux"])
        else:
            attended = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None and n_q > 1, scale=scaling, enable_gqa=gqa
            )
        out[row, q_total - n_q :] = attended[0].transpose(0, 1)
    return out, None


def _causal_mask(n_q: int, n_k: int, window: int | None, device: torch.device) -> torch.Tensor | None:
    """The mask of ``n_q`` queries that are the last of ``n_k`` keys, None where SDPA's own causal
    flag (or no mask, for one query) is exact. Query ``i`` sits at key ``n_k - n_q + i``."""
    if window is not None and n_k > window:  # a sliding layer: the last `window` keys up to the query
        ones = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
        return ones.tril(n_k - n_q) & ~ones.tril(n_k - n_q - window)
    if 1 < n_q < n_k:  # causal, aligned at the bottom right
        return torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(n_k - n_q)
    return None


def _sink_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float | None,
    sinks: torch.Tensor,
) -> torch.Tensor:
    """One row's attention whose softmax also weighs each head's learned sink logit, a slot that
    attends to nothing (gpt-oss's ``s_aux``), computed as transformers' eager attention computes it."""
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * (scaling if scaling is not None else q.shape[-1] ** -0.5)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    sink = sinks.reshape(1, -1, 1, 1).expand(1, -1, q.shape[2], 1).to(scores.dtype)
    combined = torch.cat([scores, sink], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    return torch.matmul(F.softmax(combined, dim=-1)[..., :-1], v)


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """Mask builder for the row-wise attention: it needs none (it slices each row's own keys)."""
    return None


def register() -> str:
    """Register :func:`rowwise_attention` with transformers; returns its implementation name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, rowwise_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _no_mask)
    return ATTENTION_NAME
