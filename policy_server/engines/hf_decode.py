"""The hf engine's worker thread: continuous batching over one KV cache.

Each iteration runs queued adapter commands, admits waiting requests of the running batch's adapter
version, prefills them in one forward pass and merges them into the batch, then runs one decode pass
for every running row and samples each row's next token. :class:`DecodeLoop` is the base of
:class:`~policy_server.engines.hf.HFEngine`, which sets its state up and owns the event-loop side.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from peft import PeftModel
from transformers import Cache

from policy_server.engines import batch_invariant
from policy_server.engines.base import GenerationResult
from policy_server.engines.hf_batch import (
    Batch,
    Row,
    fail,
    has_linear_attention,
    merge,
    new_cache,
    resolve,
    sample_tokens,
    select,
)
from policy_server.models.families import Family
from policy_server.models.vision_inputs import VisionInputs


class DecodeLoop:
    """The worker thread's half of the hf engine: admitting rows, prefill, decode, sampling."""

    max_batch_size: int
    device: torch.device
    dtype: torch.dtype
    batch_invariant: bool
    stats: Any
    _tokenizer: Any
    _family: Family
    _parse_tools: bool  # False: the tool-call parser is set to none, calls stay in the text
    _vision: VisionInputs | None
    _model: Any
    _adapters: set[int]
    _stop_ids: set[int]
    _min_rows: int
    _cache_argument: str
    _condition: threading.Condition
    _pending: deque[Row]
    _commands: list[tuple[Callable[[], bool], concurrent.futures.Future[None]]]
    _batch: Batch | None
    _closing: bool
    _served: int | None  # the version the LoRA layers are set for; None: unknown

    def _work(self) -> None:
        with torch.inference_mode():
            while True:
                with self._condition:
                    while not (self._closing or self._pending or self._commands or self._batch):
                        self._condition.wait()
                    if self._closing:
                        break
                    commands, self._commands = self._commands, []
                    admitted = self._admit()
                self._run_commands(commands)
                try:
                    if admitted:
                        self._start_rows(admitted)
                    if self._batch is not None:
                        self._decode_step()
                except Exception as error:  # fail this batch's requests, keep serving the next ones
                    running = self._batch.rows if self._batch is not None else []
                    for row in [*admitted, *running]:
                        fail(row.future, error)
                    self._batch = None
        closed = RuntimeError("the hf engine closed before this request finished")
        with self._condition:
            leftovers = [*self._pending, *(self._batch.rows if self._batch else [])]
            self._pending.clear()
            commands, self._commands = self._commands, []
        self._batch = None
        for row in leftovers:
            fail(row.future, closed)
        for _, future in commands:
            fail(future, closed)

    def _run_commands(
        self, commands: list[tuple[Callable[[], bool], concurrent.futures.Future[None]]]
    ) -> None:
        if commands:
            self._served = None  # a command may add, remove or switch adapters
        for command, future in commands:
            try:
                done = command()
            except Exception as error:
                fail(future, error)
                continue
            if done:
                resolve(future, None)
            else:
                with self._condition:
                    self._commands.append((command, future))

    def _admit(self) -> list[Row]:
        """Waiting rows that can join now (called with the lock held)."""
        capacity = self.max_batch_size - (len(self._batch.rows) if self._batch else 0)
        if capacity <= 0 or not self._pending:
            return []
        version = self._batch.version if self._batch else self._pending[0].request.adapter_version
        if self._pending[0].request.adapter_version != version:
            return []  # the oldest request wants another version: drain the batch first
        admitted: list[Row] = []
        waiting: deque[Row] = deque()
        while self._pending:
            row = self._pending.popleft()
            if row.future.cancelled():
                continue
            if row.request.adapter_version == version and len(admitted) < capacity:
                admitted.append(row)
            else:
                waiting.append(row)
        self._pending = waiting
        return admitted

    def _use_adapter(self, version: int) -> None:
        """Set the model's LoRA layers for ``version`` (0: all disabled) if they are set otherwise.

        peft's ``disable_adapter()`` and ``set_adapter`` each walk every module, so the layers are
        switched only when the served version changes (a batch keeps one version for all its steps)
        or after an adapter command changed the model (``_served`` is then unknown).
        """
        if version != 0 and version not in self._adapters:
            raise ValueError(f"adapter version {version} is not loaded")
        if version == self._served or not isinstance(self._model, PeftModel):
            return
        tuner = self._model.base_model
        if version == 0:
            tuner.disable_adapter_layers()
        else:
            if self._served in (0, None):
                tuner.enable_adapter_layers()
            if self._model.active_adapter != f"v{version}":
                self._model.set_adapter(f"v{version}")
        self._served = version

    def _forward(
        self, version: int, cache: Cache, lengths: tuple[list[int], list[int]], **inputs: torch.Tensor
    ) -> torch.Tensor:
        """Logits at each row's last position; ``lengths``: each row's real query and key counts."""
        inputs[self._cache_argument] = cache
        self._use_adapter(version)
        with self._invariance(lengths):
            logits = self._model(**inputs, use_cache=True, logits_to_keep=1).logits[:, -1, :]
        self.stats.forward_passes += 1
        self.stats.peak_batch_rows = max(self.stats.peak_batch_rows, int(logits.shape[0]))
        self.stats.batch_rows += int(logits.shape[0])
        return logits

    @contextmanager
    def _invariance(self, lengths: tuple[list[int], list[int]]) -> Iterator[None]:
        if not self.batch_invariant:
            yield
            return
        with batch_invariant.row_lengths(*lengths):
            yield

    def _start_rows(self, rows: list[Row]) -> None:
        """Prefill new rows, sample their first token and merge the survivors into the batch.

        A batch-invariant engine prefills a model with linear-attention layers one row at a time: the
        chunked delta rule rounds a left-padded prompt other than the same prompt alone.
        """
        if len(rows) > 1 and self.batch_invariant and has_linear_attention(self._model.config):
            for row in rows:
                self._start_rows([row])
            return
        version = rows[0].request.adapter_version
        if version != 0 and version not in self._adapters:
            for row in rows:
                fail(row.future, ValueError(f"adapter version {version} is not loaded"))
            return
        self.stats.requests += len(rows)
        width = max(len(row.prompt_ids) for row in rows)
        pad = self._tokenizer.pad_token_id or 0
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for index, row in enumerate(rows):
            input_ids[index, width - len(row.prompt_ids) :] = torch.tensor(row.prompt_ids)
            mask[index, width - len(row.prompt_ids) :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        cache = new_cache(self._model.config)
        prompt_lengths = [len(row.prompt_ids) for row in rows]
        logits = self._forward(
            version,
            cache,
            (prompt_lengths, prompt_lengths),
            input_ids=input_ids,
            attention_mask=mask,
            **self._prefill_inputs(rows, mask),
        )
        self.stats.prefill_passes += 1
        tokens = self._sample(rows, logits)
        keep = [index for index, row in enumerate(rows) if row.finish_reason is None]
        if not keep:
            return
        new = Batch(
            version=version,
            rows=rows,
            cache=cache,
            attention_mask=mask,
            next_positions=torch.tensor([row.next_position for row in rows], device=self.device),
            last_tokens=tokens,
        )
        if len(keep) < len(rows):
            select(new, keep)
        self._batch = new if self._batch is None else merge(self._batch, new)

    def _prefill_inputs(self, rows: list[Row], mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """Position ids of left-padded rows (M-RoPE's [3, B, T] for a VLM) and the rows' pixels."""
        if self._vision is None:
            return {"position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
        width = mask.shape[1]
        positions = torch.zeros((3, len(rows), width), dtype=torch.long)
        for index, row in enumerate(rows):
            assert row.positions is not None
            positions[:, index, width - row.positions.shape[1] :] = row.positions
        inputs = {"position_ids": positions.to(self.device)}
        with_images = [row.pixels for row in rows if row.pixels is not None]
        if with_images:
            inputs["pixel_values"] = torch.cat([p["pixel_values"] for p in with_images]).to(
                self.device, self.dtype
            )
            inputs["image_grid_thw"] = torch.cat([p["image_grid_thw"] for p in with_images]).to(self.device)
        return inputs

    def _decode_step(self) -> None:
        batch = self._batch
        assert batch is not None
        batch.attention_mask = F.pad(batch.attention_mask, (0, 1), value=1)
        # Each row's real keys (its prompt and every token sampled so far, the one fed now included),
        # counted on the host: summing the mask would wait for the device before every step.
        keys = [len(row.prompt_ids) + len(row.completion_ids) for row in batch.rows]
        lengths = ([1] * len(batch.rows), keys)
        logits = self._forward(
            batch.version,
            batch.cache,
            lengths,
            input_ids=batch.last_tokens[:, None],
            attention_mask=batch.attention_mask,
            position_ids=batch.next_positions[:, None],
        )
        self.stats.decode_passes += 1
        batch.next_positions = batch.next_positions + 1
        batch.last_tokens = self._sample(batch.rows, logits)
        keep = [index for index, row in enumerate(batch.rows) if row.finish_reason is None]
        if not keep:
            self._batch = None
        elif len(keep) < len(batch.rows):
            select(batch, keep)

    def _sample(self, rows: list[Row], logits: torch.Tensor) -> torch.Tensor:
        """Sample each row's next token, record it, and settle the rows that finished."""
        temperatures = torch.tensor([row.request.temperature for row in rows], device=logits.device)
        top_ps = torch.tensor([row.request.top_p for row in rows], device=logits.device)
        tokens, logprobs = sample_tokens(logits, temperatures, top_ps, [row.generator for row in rows])
        for row, token, logprob in zip(rows, tokens.tolist(), logprobs.tolist(), strict=True):
            row.completion_ids.append(token)
            row.logprobs.append(logprob)
            self.stats.completion_tokens += 1
            if row.future.cancelled():
                row.finish_reason = "cancelled"
            elif token in self._stop_ids:
                row.finish_reason = "stop"
            elif row.request.stop and self._hit_stop_string(row):
                row.finish_reason = "stop"
            elif len(row.completion_ids) >= row.max_new_tokens:
                row.finish_reason = "length"
            if row.finish_reason is not None and not row.future.cancelled():
                resolve(row.future, self._result(row))
        return tokens

    def _hit_stop_string(self, row: Row) -> bool:
        text = self._tokenizer.decode(row.completion_ids, skip_special_tokens=True)
        hits = [index for stop in row.request.stop or [] if stop and (index := text.find(stop)) >= 0]
        if not hits:
            return False
        row.stopped_text = text[: min(hits)]
        return True

    def _result(self, row: Row) -> GenerationResult:
        ids = row.completion_ids
        tools = self._parse_tools and bool(row.request.tools) and row.request.tool_choice != "none"
        family = self._family.parsing_for(row.request.chat_template_kwargs).with_tools(row.request.tools)
        if row.stopped_text is not None:
            parsed = family.parse_text(row.stopped_text, tools=tools)
        else:
            text_ids = ids[:-1] if ids and ids[-1] in self._stop_ids else ids
            parsed = family.parse(self._tokenizer, text_ids, tools=tools)
        return GenerationResult(
            prompt_token_ids=row.prompt_ids,
            completion_token_ids=list(ids),
            completion_logprobs=list(row.logprobs),
            logprobs_mode="raw",
            finish_reason="tool_calls" if parsed.tool_calls else (row.finish_reason or "stop"),
            content=parsed.content,
            tool_calls=parsed.tool_calls,
            reasoning_content=parsed.reasoning_content,
            truncated=row.finish_reason == "length",
        )
