"""An exact attention for training that never holds a whole sequence's [T, T] scores.

transformers' eager attention (gpt-oss's before this: its attention sinks have no SDPA kernel)
computes ``[rows, heads, T, T]`` scores per layer and autograd keeps them, and the softmax's output,
for the backward: at 8k tokens and 64 heads that is gigabytes per layer. This attention computes the
same softmax a block of :data:`QUERY_CHUNK` queries at a time, each block over exactly the keys it
sees (causal: the keys up to its last query; a sliding-window layer: the window before its first
query too), with nothing but pure torch, so it runs on every device the learner does and is tested
on the CPU. Each block's softmax runs over all of its queries' keys at once (no online rescaling),
so a query's numbers are those of one full-row softmax, whatever the block size.

Under autograd each block is checkpointed (``torch.utils.checkpoint``, non-reentrant): its forward
keeps only its inputs (views of the layer's queries, keys and values, already alive) and the
backward recomputes its scores, one block at a time. Working memory, for one layer at a time:
``rows x heads x QUERY_CHUNK x keys`` float32 scores (keys: the block's keys, at most T), a few
such buffers during its softmax and its backward; the layer's own tensors (queries, keys, values,
output) are linear in T. Why not flex attention, which transformers' gpt-oss also runs (sinks as a
score modification): outside ``torch.compile`` it computes the full scores, and compiled it needs
inductor (on a CPU a C++ toolchain and minutes of compiling); this is plain torch on every device, the
one code path the CPU suite checks against eager.

What it handles: causal masks, sliding windows (``sliding_window``: a query sees that many keys,
ending at its own), grouped-query attention (no repeated keys: queries are grouped by their key
head), right or left padding (the 2-D mask :func:`padding_mask` hands it) and attention sinks
(gpt-oss's ``s_aux``: a learned per-head logit in the softmax's denominator that attends to
nothing). The products run in the model's dtype and the softmax in float32. Queries are the last
``Q`` of the ``K`` keys (``Q == K`` in training), as transformers' cache lays them out.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

ATTENTION_NAME = "rftkit_chunked"
# Queries per block: the working memory is this times the heads and keys of the block, per row.
QUERY_CHUNK = 128


class ChunkedAttentionError(ValueError):
    """An attention setting or mask pattern the chunked attention does not compute."""


def padding_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    attention_mask: torch.Tensor | None = None,
    allow_is_causal_skip: bool = True,
    **kwargs: Any,
) -> torch.Tensor | None:
    """The mask builder transformers calls for this attention (``AttentionMaskInterface``): the 2-D
    ``[rows, keys]`` boolean padding mask, the causal and sliding patterns being computed per block.

    transformers turns ``allow_is_causal_skip`` off where the mask is more than causal, sliding and
    padding (packed sequences, bidirectional image blocks, custom overlays): those are refused.
    """
    if not allow_is_causal_skip:
        raise ChunkedAttentionError(
            f"the {ATTENTION_NAME!r} attention computes causal and sliding-window masks with padding; "
            "this model or input asks for another mask pattern (packed sequences, bidirectional "
            "blocks): load the model with attn_implementation 'eager' or 'sdpa' instead"
        )
    if attention_mask is None:
        return None
    mask = attention_mask[:, -kv_length:].to(torch.bool)
    return None if bool(mask.all()) else mask


def chunked_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention in transformers' signature, a block of queries at a time.

    ``query`` is ``[rows, heads, Q, dim]``, ``key``/``value`` ``[rows, kv_heads, K, dim]``,
    ``attention_mask`` None or :func:`padding_mask`'s ``[rows, K]`` (True: a real key). Returns
    ``[rows, Q, heads, dim]`` and no weights.
    """
    _check_supported(attention_mask, dropout, kwargs)
    rows, heads, q_total, dim = query.shape
    kv_heads, k_total = key.shape[1], key.shape[2]
    scale = scaling if scaling is not None else dim**-0.5
    # [rows, kv_heads, group, Q, dim]: each key head's queries together, so keys are never repeated.
    grouped = query.reshape(rows, kv_heads, heads // kv_heads, q_total, dim)
    sinks = None if s_aux is None else s_aux.reshape(1, kv_heads, heads // kv_heads, 1, 1)
    offset = k_total - q_total  # query i sits at key position offset + i
    recompute = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (query, key, value, s_aux)
    )
    blocks = []
    for start in range(0, q_total, QUERY_CHUNK):
        stop = min(start + QUERY_CHUNK, q_total)
        first_key = 0 if sliding_window is None else max(0, offset + start - sliding_window + 1)
        last_key = offset + stop  # exclusive: the block's last query sees keys up to its own
        inputs = (
            grouped[:, :, :, start:stop],
            key[:, :, first_key:last_key],
            value[:, :, first_key:last_key],
            sinks,
            None if attention_mask is None else attention_mask[:, first_key:last_key],
        )
        layout = (offset + start, first_key, sliding_window, scale)
        if recompute:
            # Nothing in a block draws random numbers: no RNG state to save and restore per block.
            blocks.append(checkpoint(_block, *inputs, *layout, use_reentrant=False, preserve_rng_state=False))
        else:
            blocks.append(_block(*inputs, *layout))
    out = torch.cat(blocks, dim=3)  # [rows, kv_heads, group, Q, dim]
    return out.reshape(rows, heads, q_total, dim).transpose(1, 2).contiguous(), None


def _check_supported(attention_mask: torch.Tensor | None, dropout: float, kwargs: dict[str, Any]) -> None:
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ChunkedAttentionError(
            f"the {ATTENTION_NAME!r} attention takes a 2-D padding mask ([rows, keys]), not a "
            f"{attention_mask.dim()}-D one: pass the model a 2-D attention_mask, or load it with "
            "attn_implementation 'eager'"
        )
    if dropout:
        raise ChunkedAttentionError(
            f"the {ATTENTION_NAME!r} attention has no attention dropout (the model's config sets "
            f"{dropout}): set the config's attention_dropout to 0, or load it with "
            "attn_implementation 'eager'"
        )
    if kwargs.get("softcap") is not None:
        raise ChunkedAttentionError(
            f"the {ATTENTION_NAME!r} attention has no logit soft-capping: load this model with "
            "attn_implementation 'eager' or 'sdpa'"
        )


def _block(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    sinks: torch.Tensor | None,
    padding: torch.Tensor | None,
    first_query: int,
    first_key: int,
    window: int | None,
    scale: float,
) -> torch.Tensor:
    """One block's attention: ``queries`` [rows, kv_heads, group, C, dim] at key positions
    ``first_query...``, over ``keys``/``values`` [rows, kv_heads, S, dim] at ``first_key...``."""
    rows, kv_heads, group, count, dim = queries.shape
    # One product per key head for all its query heads (no copies of the keys), in the model's dtype
    # (bf16 tensor cores on a GPU); the softmax in float32.
    flat = queries.reshape(rows, kv_heads, group * count, dim)
    products = torch.matmul(flat, keys.transpose(-1, -2)).view(rows, kv_heads, group, count, -1)
    scores = products.float() * scale
    query_at = torch.arange(first_query, first_query + count, device=queries.device)[:, None]
    key_at = torch.arange(first_key, first_key + keys.shape[2], device=queries.device)[None, :]
    seen = key_at <= query_at
    if window is not None:
        seen = seen & (key_at > query_at - window)
    allowed = seen if padding is None else seen & padding[:, None, None, None, :]
    # The float32 minimum, as eager's additive mask: a row with no key left stays finite.
    scores = scores.masked_fill(~allowed, torch.finfo(torch.float32).min)
    if sinks is None:
        probs = F.softmax(scores, dim=-1)
    else:
        sink = sinks.float()
        top = torch.maximum(scores.amax(dim=-1, keepdim=True), sink)
        weights = torch.exp(scores - top)
        probs = weights / (weights.sum(dim=-1, keepdim=True) + torch.exp(sink - top))
    flat_probs = probs.to(values.dtype).view(rows, kv_heads, group * count, -1)
    return torch.matmul(flat_probs, values).view(rows, kv_heads, group, count, dim)


def register_training_attention(name: str | None) -> str | None:
    """``name``, registered with transformers first when it is this attention's (a family's
    ``train_attn_implementation`` may name it): transformers' own names pass through unchanged."""
    return register() if name == ATTENTION_NAME else name


def register() -> str:
    """Register :func:`chunked_attention` and its mask builder with transformers; returns the name
    ``from_pretrained(attn_implementation=...)`` takes."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, chunked_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, padding_mask)
    return ATTENTION_NAME
