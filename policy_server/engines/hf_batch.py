"""The hf engine's running batch: rows being generated, their shared left-padded cache, and how rows
are sampled, merged in and dropped.

The cache holds one layer per decoder layer: a :class:`GrowingLayer` of keys and values for an
attention layer, a :class:`RecurrentLayer` of conv and recurrent states for a linear-attention layer
(Qwen 3.5's Gated DeltaNet, ``config.layer_types``). Both join rows (``stack``) and drop them
(``keep``) the same way, so a batch of a hybrid model merges and shrinks as any other."""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers import Cache, DynamicLayer
from transformers.cache_utils import LinearAttentionLayer

from policy_server.engines.base import GenerationRequest, GenerationResult


@dataclass
class Row:
    """One request while the worker generates it."""

    request: GenerationRequest
    prompt_ids: list[int]
    max_new_tokens: int
    generator: torch.Generator
    future: concurrent.futures.Future[GenerationResult]
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stopped_text: str | None = None
    # Vision-language models only: the call's pixel inputs (None without images), the prompt's
    # [3, prompt length] M-RoPE positions and the position of the first completion token.
    pixels: dict[str, torch.Tensor] | None = None
    positions: torch.Tensor | None = None
    next_position: int = 0


class GrowingLayer(DynamicLayer):
    """A KV layer that appends into spare capacity (doubling) instead of re-concatenating every step.

    ``keys``/``values`` stay views of the buffers. Rows that join (:meth:`stack`) or leave
    (:meth:`keep`) are copied once into fresh buffers with room to grow; if anything else replaces
    ``keys``/``values``, the next update copies them into fresh buffers.
    """

    keys: torch.Tensor  # set by DynamicLayer (annotations only: no class attribute is created)
    values: torch.Tensor
    _key_buffer: torch.Tensor | None = None
    _value_buffer: torch.Tensor | None = None
    _keys_view: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        old = self.get_seq_length()
        new = old + key_states.shape[-2]
        buffer = self._key_buffer
        if buffer is None or buffer.shape[-2] < new or self.keys is not self._keys_view:
            keys, values = _room(key_states, key_states.shape[0], new)
            if old:
                keys[..., :old, :] = self.keys
                values[..., :old, :] = self.values
            self._adopt(keys, values, old)
        assert self._key_buffer is not None and self._value_buffer is not None
        self._key_buffer[..., old:new, :] = key_states
        self._value_buffer[..., old:new, :] = value_states
        self._adopt(self._key_buffer, self._value_buffer, new)
        return self.keys, self.values

    def keep(self, runs: list[tuple[int, int]], first: int) -> None:
        """Keep the rows of ``runs`` (``[start, stop)`` ranges, in order), from column ``first`` on.

        One copy per run, straight into the new buffers (indexing with a tensor of rows would copy
        into a temporary first, and copying into a strided buffer by ``index_select`` is slow).
        """
        used = self.keys.shape[-2] - first
        rows = sum(stop - start for start, stop in runs)
        keys, values = _room(self.keys, rows, used)
        row = 0
        for start, stop in runs:
            keys[row : row + stop - start, ..., :used, :] = self.keys[start:stop, ..., first:, :]
            values[row : row + stop - start, ..., :used, :] = self.values[start:stop, ..., first:, :]
            row += stop - start
        self._adopt(keys, values, used)

    def stack(self, other: GrowingLayer, width: int) -> None:
        """Append ``other``'s rows after these, both left-padded with zeros to ``width`` columns."""
        rows, total = self.keys.shape[0], self.keys.shape[0] + other.keys.shape[0]
        keys, values = _room(self.keys, total, width)
        for buffer, parts in ((keys, (self.keys, other.keys)), (values, (self.values, other.values))):
            for start, part in zip((0, rows), parts, strict=True):
                stop, pad = start + part.shape[0], width - part.shape[-2]
                buffer[start:stop, ..., :pad, :] = 0
                buffer[start:stop, ..., pad:width, :] = part
        self._adopt(keys, values, width)

    def _adopt(self, keys: torch.Tensor, values: torch.Tensor, used: int) -> None:
        self._key_buffer, self._value_buffer = keys, values
        self.keys, self.values = keys[..., :used, :], values[..., :used, :]
        self._keys_view = self.keys


def _room(like: torch.Tensor, rows: int, used: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty key and value buffers of ``rows`` rows with room for ``used`` columns and as many more."""
    shape = (rows, *like.shape[1:-2], max(2 * used, 64), like.shape[-1])
    return like.new_empty(shape), like.new_empty(shape)


class RecurrentLayer(LinearAttentionLayer):
    """A linear-attention layer's cache (a conv state and a recurrent state per row, no sequence
    axis) whose rows join and leave as :class:`GrowingLayer`'s do.

    A left-padded prefill leaves a row's states as its prompt alone leaves them up to rounding: the
    model zeroes the padding's inputs, so the recurrent state stays zero through it and the conv
    state keeps zeros left of the prompt. Rounding differs (the chunked delta rule groups the prompt
    by its offset), which is why the batch-invariant engine prefills such models one row at a time.
    """

    def keep(self, runs: list[tuple[int, int]], first: int) -> None:
        """Keep the rows of ``runs`` (``[start, stop)`` ranges, in order); ``first`` is for KV layers."""
        for states in (self.conv_states, self.recurrent_states):
            for index, state in states.items():
                if state is not None:
                    states[index] = torch.cat([state[start:stop] for start, stop in runs])

    def stack(self, other: RecurrentLayer, width: int) -> None:
        """Append ``other``'s rows after these; ``width`` is for KV layers."""
        pairs = ((self.conv_states, other.conv_states), (self.recurrent_states, other.recurrent_states))
        for states, others in pairs:
            for index, state in states.items():
                if state is not None:
                    states[index] = torch.cat([state, others[index]])


def has_linear_attention(config: Any) -> bool:
    """Whether a model has linear-attention layers (its text config's ``layer_types``)."""
    return "linear_attention" in (getattr(config.get_text_config(), "layer_types", None) or ())


def new_cache(config: Any) -> Cache:
    """An empty cache for a model: a :class:`RecurrentLayer` for each linear-attention layer of its
    ``layer_types``, a :class:`GrowingLayer` for each other layer."""
    if not has_linear_attention(config):
        return Cache(layer_class_to_replicate=GrowingLayer)
    kinds = config.get_text_config().layer_types
    return Cache(
        layers=[RecurrentLayer() if kind == "linear_attention" else GrowingLayer() for kind in kinds]
    )


@dataclass
class Batch:
    """The running rows and their shared, left-padded KV cache."""

    version: int
    rows: list[Row]
    cache: Cache
    attention_mask: torch.Tensor  # [rows, cached positions], 0 where padding
    next_positions: torch.Tensor  # [rows] position id of each row's next token
    last_tokens: torch.Tensor  # [rows] sampled, not yet fed to the model


def sample_tokens(
    logits: torch.Tensor, temperatures: torch.Tensor, top_ps: torch.Tensor, generators: list[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (token ids, raw logprobs of those tokens).

    Temperature 0 is greedy. Each row draws one uniform number from its own generator, so a seeded
    request samples the same tokens whatever else shares its batch.
    """
    logits = logits.float()
    raw_logprobs = torch.log_softmax(logits, dim=-1)
    greedy = temperatures <= 0
    scaled = logits / torch.where(greedy, torch.ones_like(temperatures), temperatures)[:, None]
    probs = torch.softmax(scaled, dim=-1)
    nucleus = (top_ps < 1).nonzero().squeeze(-1)
    if len(nucleus):  # sorting is the costly part, so only rows that use top-p pay for it
        sorted_probs, order = probs[nucleus].sort(dim=-1, descending=True)
        # Keep a token while the mass before it is below top_p (the most likely always stays).
        sorted_probs = sorted_probs * ((sorted_probs.cumsum(dim=-1) - sorted_probs) < top_ps[nucleus, None])
        probs[nucleus] = torch.zeros_like(sorted_probs).scatter(-1, order, sorted_probs)
    cumulative = probs.cumsum(dim=-1)
    uniforms = torch.stack([torch.rand((), generator=g, device=g.device) for g in generators])
    thresholds = (uniforms.to(cumulative.device) * cumulative[:, -1])[:, None]
    sampled = torch.searchsorted(cumulative, thresholds, right=True).clamp(max=logits.shape[-1] - 1)
    tokens = torch.where(greedy, logits.argmax(dim=-1), sampled.squeeze(-1))
    return tokens, raw_logprobs.gather(-1, tokens[:, None]).squeeze(-1)


def _layers(cache: Cache) -> list[GrowingLayer | RecurrentLayer]:
    layers = [layer for layer in cache.layers if isinstance(layer, (GrowingLayer, RecurrentLayer))]
    assert len(layers) == len(cache.layers), "the engine's caches hold GrowingLayer and RecurrentLayer only"
    return layers


def merge(batch: Batch, new: Batch) -> Batch:
    """One batch holding both: the shorter cache is left-padded (masked) to the longer's length."""
    width = max(batch.attention_mask.shape[1], new.attention_mask.shape[1])

    def left_pad(tensor: torch.Tensor, dim_from_end: int) -> torch.Tensor:
        missing = width - tensor.shape[-dim_from_end]
        if missing == 0:
            return tensor
        return F.pad(tensor, (0, 0) * (dim_from_end - 1) + (missing, 0))

    for layer, new_layer in zip(_layers(batch.cache), _layers(new.cache), strict=True):
        layer.stack(new_layer, width)
    batch.attention_mask = torch.cat([left_pad(batch.attention_mask, 1), left_pad(new.attention_mask, 1)])
    batch.rows = batch.rows + new.rows
    batch.next_positions = torch.cat([batch.next_positions, new.next_positions])
    batch.last_tokens = torch.cat([batch.last_tokens, new.last_tokens])
    return batch


def select(batch: Batch, keep: list[int]) -> None:
    """Keep only the rows ``keep``; drop cache columns that are padding for every remaining row."""
    index = torch.tensor(keep, device=batch.attention_mask.device)
    mask = batch.attention_mask[index]
    first = int(mask.any(dim=0).to(torch.int8).argmax())
    runs: list[tuple[int, int]] = []  # consecutive kept rows, copied together
    for row in keep:
        if runs and runs[-1][1] == row:
            runs[-1] = (runs[-1][0], row + 1)
        else:
            runs.append((row, row + 1))
    for layer in _layers(batch.cache):
        layer.keep(runs, first)
    batch.attention_mask = mask[:, first:]
    batch.rows = [batch.rows[i] for i in keep]
    batch.next_positions = batch.next_positions[index]
    batch.last_tokens = batch.last_tokens[index]


def resolve(future: concurrent.futures.Future[Any], value: Any) -> None:
    if not future.done():
        try:
            future.set_result(value)
        except concurrent.futures.InvalidStateError:  # cancelled by the caller in the meantime
            pass


def fail(future: concurrent.futures.Future[Any], error: BaseException) -> None:
    if not future.done():
        try:
            future.set_exception(error)
        except concurrent.futures.InvalidStateError:
            pass
