"""Token logprobs and entropies from a model's last hidden states, a chunk of positions at a time.

A causal LM's output head turns hidden states [B, T, H] into logits [B, T, V]. With a large
vocabulary that tensor dominates the learner's memory: 8k tokens x 150k vocabulary is ~5 GB in
float32, more with the softmax and its gradient. Here the head runs only at the positions whose
token is trained (the loss mask), a chunk of positions at a time, and each chunk is checkpointed:
the backward pass recomputes that chunk's logits instead of keeping them. The [chunk, V] logits
are the largest tensor alive at any moment.

The numbers are :func:`trainer.algo.grpo.token_logprobs` and :func:`trainer.algo.grpo.entropy_from_logits`
evaluated at the masked positions (0 elsewhere), in the same float32 arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

Head = Callable[[Tensor], Tensor]


def logit_transform(model_config: Any) -> Callable[[Tensor], Tensor] | None:
    """What a model's forward does to the head's output before returning logits, from its config.

    Gemma 2 and 3 soft-cap the final logits (``final_logit_softcapping``); most models do nothing.
    """
    cap = getattr(model_config, "final_logit_softcapping", None)
    if cap:
        return lambda logits: torch.tanh(logits / cap) * cap
    return None


def _chunk(
    hidden: Tensor, targets: Tensor, head: Head, transform: Callable[[Tensor], Tensor] | None
) -> tuple[Tensor, Tensor]:
    logits = head(hidden)
    if transform is not None:
        logits = transform(logits)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    with torch.no_grad():
        logp = torch.log_softmax(logits.detach(), dim=-1)
        entropy = -(logp.exp() * logp).sum(dim=-1)
    return logprobs, entropy


def chunked_token_logprobs(
    hidden: Tensor,
    head: Head,
    input_ids: Tensor,
    mask: Tensor,
    *,
    chunk_size: int = 1024,
    transform: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Logprobs [B, T] (with grad) and entropies [B, T] (without) of the tokens ``mask`` marks.

    ``hidden``: [B, T, H] last hidden states (after the final norm); ``head``: the output head
    (hidden -> logits); ``mask``: [B, T], 1 where column t's token is trained. Column t is about
    token t, predicted from position t - 1, as in :func:`trainer.algo.grpo.token_logprobs`; column 0 and
    unmasked columns are 0.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    batch, length, _ = hidden.shape
    rows, columns = mask[:, 1:].nonzero(as_tuple=True)
    predicting = hidden[:, :-1][rows, columns]
    targets = input_ids[:, 1:][rows, columns]
    pieces: list[Tensor] = []
    entropies: list[Tensor] = []
    recompute = torch.is_grad_enabled() and predicting.requires_grad
    for start in range(0, len(targets), chunk_size):
        part = (predicting[start : start + chunk_size], targets[start : start + chunk_size], head, transform)
        if recompute:
            logprobs, entropy = checkpoint(_chunk, *part, use_reentrant=False)
        else:
            logprobs, entropy = _chunk(*part)
        pieces.append(logprobs)
        entropies.append(entropy)
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    zeros = torch.zeros((batch, length), dtype=dtype, device=hidden.device)
    if not pieces:
        return zeros, zeros.clone()
    index = (rows, columns + 1)
    return zeros.index_put(index, torch.cat(pieces)), zeros.index_put(index, torch.cat(entropies))
