"""The built-in engine: transformers + peft, continuous batching over a KV cache, raw logprobs.

One worker thread owns the model; the event loop only renders prompts and awaits results. Each
iteration the worker:

1. runs queued adapter commands (peft adapters named ``v{n}``, added to and removed from the one
   base model, never reloading it);
2. admits waiting requests that use the running batch's adapter version (up to ``max_batch_size``
   rows), prefills them in one forward pass and merges their KV cache into the running batch
   (left padding, so every row keeps its own positions);
3. runs one decode forward pass for every running row and samples each row's next token.

Rows finish independently (``<|im_end|>``/``<|endoftext|>``, stop strings, ``max_tokens``, the
context length) and leave the batch, so requests arriving mid-generation join at the next step
instead of waiting for a whole wave. Requests for another adapter version wait until the running
batch drains (first come, first served across versions). Version 0 runs with adapters disabled.

Logprobs are raw: log-softmax of the unprocessed logits at the sampled token (``logprobs_mode``
"raw"), which is what the trainer recomputes. Completion ids end with the stop token when one was
sampled. Tool calls are parsed (hermes ``<tool_call>``) when the request has tools and
``tool_choice`` is not "none"; other ``tool_choice`` values are not enforced (no guided decoding).
Sampling is seeded per request: ``request.seed``, or the engine's seed plus a counter. With
``batch_invariant`` (the default) a row's logits do not depend on which rows share its batch
(``batch_invariant.py``), so a seeded request samples the same tokens however requests are timed.

Vision-language models (a config with a ``vision_config`` and an ``image_token_id``, e.g. Qwen2-VL)
load through ``AutoModelForImageTextToText`` and take images (``supports_images``). A call's images
go through the model's image processor (``policy_server/models/vision_inputs.py``, shared with the
learner); each ``<|image_pad|>`` the template renders is expanded to the image's patch tokens before
the prompt ids are recorded, so the recorded ids are exactly what the model saw. Prefill feeds the
rows' pixels and their M-RoPE positions (time, height, width); decode continues each row from its
largest position + 1. Text-only rows share batches with image rows. With ``batch_invariant`` the
row-wise attention applies to the language model only: the vision tower attends within each image
(one block per image, whatever the batch), so it keeps transformers' SDPA.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from peft import PeftModel
from peft.tuners.tuners_utils import BaseTunerLayer
from transformers import AutoConfig, Cache, DynamicLayer

from policy_server.engines import batch_invariant
from policy_server.engines.base import EngineOccupancy, GenerationRequest, GenerationResult
from policy_server.http.chat_format import normalize_messages, parse_tool_calls
from policy_server.models.chat_templates import chat_template_path, load_tokenizer
from policy_server.models.vision_inputs import VisionInputs, is_vision_model, load_model, position_ids

_STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")


@dataclass
class EngineStats:
    """Counters of the work the engine did; ``forward_passes`` counts model calls of any kind."""

    forward_passes: int = 0
    prefill_passes: int = 0
    decode_passes: int = 0
    peak_batch_rows: int = 0
    batch_rows: int = 0  # rows summed over forward passes: batch_rows / forward_passes is the mean batch
    requests: int = 0
    completion_tokens: int = 0


@dataclass
class _Row:
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


class _GrowingLayer(DynamicLayer):
    """A KV layer that appends into spare capacity (doubling) instead of re-concatenating every step.

    ``keys``/``values`` stay views of the buffers; when the engine replaces them (merging or dropping
    rows) the next update copies them into fresh buffers.
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
            shape = (*key_states.shape[:-2], max(2 * new, 64), key_states.shape[-1])
            self._key_buffer, self._value_buffer = key_states.new_empty(shape), value_states.new_empty(shape)
            if old:
                self._key_buffer[..., :old, :] = self.keys
                self._value_buffer[..., :old, :] = self.values
        assert self._key_buffer is not None and self._value_buffer is not None
        self._key_buffer[..., old:new, :] = key_states
        self._value_buffer[..., old:new, :] = value_states
        self.keys, self.values = self._key_buffer[..., :new, :], self._value_buffer[..., :new, :]
        self._keys_view = self.keys
        return self.keys, self.values


@dataclass
class _Batch:
    """The running rows and their shared, left-padded KV cache."""

    version: int
    rows: list[_Row]
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


def _validate(request: GenerationRequest) -> None:
    if request.max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {request.max_tokens}")
    if request.temperature < 0:
        raise ValueError(f"temperature must be 0 or more, got {request.temperature}")
    if not 0 < request.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {request.top_p}")
    if not request.messages:
        raise ValueError("messages must not be empty")


class HFEngine:
    """An in-process engine on transformers + peft (CPU or a small GPU)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        max_batch_size: int = 64,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
        batch_invariant: bool = True,
        chat_template: str | Path | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.model_dir = Path(model_dir)
        self.model_name = self.model_dir.name
        self.max_batch_size = max_batch_size
        self.device = torch.device(device)
        self.dtype = dtype
        # A row's logits are the same to the last bit whichever rows share its batch (see
        # batch_invariant.py), so seeded requests sample the same tokens however agents are timed.
        self.batch_invariant = batch_invariant
        self.stats = EngineStats()
        # Checked now, so a bad setting fails before the model loads; applied to the tokenizer in _load.
        self._chat_template = chat_template_path(chat_template) if chat_template is not None else None
        self._seeds = itertools.count(seed << 32)
        self._tokenizer: Any = None
        self._vision: VisionInputs | None = None
        self._model: Any = None  # the base model, or the PeftModel wrapping it once an adapter is loaded
        self._adapters: set[int] = set()
        self._stop_ids: set[int] = set()
        self._max_positions = 0
        self._min_rows = 0
        self._cache_argument = "past_key_values"
        self._condition = threading.Condition()
        self._pending: deque[_Row] = deque()
        self._commands: list[tuple[Callable[[], bool], concurrent.futures.Future[None]]] = []
        self._batch: _Batch | None = None
        self._closing = False
        self._thread: threading.Thread | None = None

    @property
    def supports_images(self) -> bool:
        """Whether the served model takes images (a vision-language model, once started)."""
        return self._vision is not None

    @property
    def image_token_id(self) -> int | None:
        """The placeholder token an image's patches take in the prompt ids (None: text-only)."""
        return self._vision.image_token_id if self._vision is not None else None

    # ---- Engine protocol -------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the tokenizer and base model and start the worker thread."""
        if self._thread is not None:
            return
        await asyncio.to_thread(self._load)
        self._closing = False
        self._thread = threading.Thread(target=self._work, name=f"hf-engine-{self.model_name}", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        """Stop the worker; requests still waiting or running fail with a RuntimeError."""
        thread = self._thread
        if thread is None:
            return
        with self._condition:
            self._closing = True
            self._condition.notify_all()
        await asyncio.to_thread(thread.join)
        self._thread = None

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Sample one completion; concurrent calls share forward passes."""
        if self._thread is None:
            raise RuntimeError("the hf engine is not running: call start() first")
        _validate(request)
        if request.adapter_version != 0 and request.adapter_version not in self._adapters:
            raise ValueError(f"adapter version {request.adapter_version} is not loaded")
        prompt_ids, pixels = await asyncio.to_thread(self._render, request)
        room = self._max_positions - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"the prompt is {len(prompt_ids)} tokens, which leaves no room in the model's "
                f"{self._max_positions}-token context"
            )
        seed = request.seed if request.seed is not None else next(self._seeds)
        row = _Row(
            request=request,
            prompt_ids=prompt_ids,
            max_new_tokens=min(request.max_tokens, room),
            generator=torch.Generator(device=self.device).manual_seed(seed),
            future=concurrent.futures.Future(),
            pixels=pixels,
            next_position=len(prompt_ids),
        )
        if self._vision is not None:
            positions = await asyncio.to_thread(self._positions, prompt_ids, pixels)
            row.positions, row.next_position = positions, int(positions.max()) + 1
        with self._condition:
            if self._closing:
                raise RuntimeError("the hf engine is closing")
            self._pending.append(row)
            self._condition.notify_all()
        return await asyncio.wrap_future(row.future)

    def occupancy(self) -> EngineOccupancy:
        """Rows decoding now, rows waiting, the batch limit and the running pass and row totals."""
        batch = self._batch  # read without the worker's lock: a count at most one pass old
        with self._condition:
            waiting = len(self._pending)
        return EngineOccupancy(
            running=len(batch.rows) if batch is not None else 0,
            waiting=waiting,
            capacity=self.max_batch_size,
            forward_passes=self.stats.forward_passes,
            batch_rows=self.stats.batch_rows,
        )

    async def load_adapter(self, version: int, path: str) -> None:
        """Add the peft adapter at ``path`` as version ``version`` (adapter name ``v{version}``)."""
        if version < 1:
            raise ValueError(f"adapter versions start at 1 (0 is the base model), got {version}")
        self._check_fresh(version)
        if not (Path(path) / "adapter_config.json").is_file():
            raise ValueError(f"{path} is not a peft adapter directory (no adapter_config.json in it)")

        def load() -> bool:
            self._check_fresh(version)  # again: another load may have taken the number meanwhile
            name = f"v{version}"
            try:
                if isinstance(self._model, PeftModel):
                    self._model.load_adapter(path, adapter_name=name, is_trainable=False)
                else:
                    self._model = PeftModel.from_pretrained(
                        self._model, path, adapter_name=name, is_trainable=False
                    )
            except Exception:
                self._discard_failed_adapter(name)
                raise
            if self.batch_invariant:
                batch_invariant.pad_rows(self._model, self._min_rows)  # the new adapter's layers
            self._adapters.add(version)
            return True

        await self._command(load)

    async def unload_adapter(self, version: int) -> None:
        """Remove version ``version``; waits until no running row uses it. Unknown versions are a no-op."""

        def unload() -> bool:
            if self._batch is not None and self._batch.version == version:
                return False  # retried after the running batch drains
            if version not in self._adapters:
                return True
            self._adapters.discard(version)
            if self._adapters:
                # Activate a remaining adapter first: peft warns when the active one is deleted.
                self._model.set_adapter(f"v{max(self._adapters)}")
                self._model.delete_adapter(f"v{version}")
            else:
                # peft cannot delete its last adapter; unwrapping restores the untouched base modules.
                self._model = self._model.unload()
            return True

        await self._command(unload)

    def _discard_failed_adapter(self, name: str) -> None:
        """Undo what a failed load injected, so the served model is the one it was before."""
        if isinstance(self._model, PeftModel):
            if name in self._model.peft_config:
                if self._model.active_adapter == name and self._adapters:
                    self._model.set_adapter(f"v{max(self._adapters)}")
                self._model.delete_adapter(name)
            return
        # PeftModel.from_pretrained injects LoRA layers into the base model before reading the weights.
        for module_name, module in list(self._model.named_modules()):
            if isinstance(module, BaseTunerLayer):
                parent_name, _, child = module_name.rpartition(".")
                setattr(self._model.get_submodule(parent_name), child, module.get_base_layer())
        if hasattr(self._model, "peft_config"):
            del self._model.peft_config

    def _check_fresh(self, version: int) -> None:
        if version in self._adapters:
            raise ValueError(f"adapter version {version} is already loaded; use a fresh version number")

    # ---- event-loop side ------------------------------------------------------------------------

    async def _command(self, command: Callable[[], bool]) -> None:
        if self._thread is None:
            raise RuntimeError("the hf engine is not running: call start() first")
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._condition:
            self._commands.append((command, future))
            self._condition.notify_all()
        await asyncio.wrap_future(future)

    def _render(self, request: GenerationRequest) -> tuple[list[int], dict[str, torch.Tensor] | None]:
        """The prompt's token ids (image placeholders expanded) and, with images, their pixel inputs."""
        if request.images and self._vision is None:
            raise ValueError("this model is text-only and takes no images")
        ids = self._template_ids(request)
        if not request.images:
            return ids, None
        assert self._vision is not None
        pixels = self._vision.pixels(request.images)
        return self._vision.expand(ids, pixels["image_grid_thw"]), pixels

    def _positions(self, prompt_ids: list[int], pixels: dict[str, torch.Tensor] | None) -> torch.Tensor:
        ids = torch.tensor([prompt_ids])
        grid = pixels["image_grid_thw"] if pixels is not None else None
        return position_ids(self._model, ids, torch.ones_like(ids), grid)[:, 0]

    def _template_ids(self, request: GenerationRequest) -> list[int]:
        kwargs = dict(request.chat_template_kwargs)
        if request.reasoning_effort is not None:
            kwargs.setdefault("reasoning_effort", request.reasoning_effort)
        try:
            ids = self._tokenizer.apply_chat_template(
                normalize_messages(request.messages),
                tools=request.tools or None,
                add_generation_prompt=True,
                return_dict=False,
                **kwargs,
            )
        except Exception as error:  # jinja errors come in many classes; the message is what helps
            raise ValueError(f"the chat template could not render these messages: {error}") from error
        # Checked here, where it fails this request alone: a row without plain ids would fail its batch.
        if not isinstance(ids, list) or not all(type(token) is int for token in ids):
            raise ValueError("the chat template did not render to a list of token ids")
        return ids

    # ---- worker thread --------------------------------------------------------------------------

    def _load(self) -> None:
        self._tokenizer = load_tokenizer(self.model_dir, self._chat_template)
        config = AutoConfig.from_pretrained(self.model_dir)
        vision = is_vision_model(config)
        options: dict[str, Any] = {"dtype": self.dtype}
        if self.batch_invariant:
            name = batch_invariant.register()
            # The vision tower attends within each image already; only the language model needs it.
            options["attn_implementation"] = (
                {"text_config": name, "vision_config": "sdpa"} if vision else name
            )
        model = load_model(self.model_dir, **options)
        self._model = model.to(self.device).eval()
        self._vision = VisionInputs(self.model_dir, config) if vision else None
        self._stop_ids = {
            token_id
            for token in _STOP_TOKENS
            if (token_id := self._tokenizer.convert_tokens_to_ids(token)) is not None
            and token_id != self._tokenizer.unk_token_id
        }
        eos = model.generation_config.eos_token_id
        self._stop_ids.update([eos] if isinstance(eos, int) else (eos or []))
        text_config = model.config.get_text_config()
        self._max_positions = int(text_config.max_position_embeddings)
        self._min_rows = batch_invariant.min_gemm_rows()
        if self.batch_invariant:
            batch_invariant.pad_rows(self._model, self._min_rows)
        # transformers renamed `past_key_values` to `cache` during 5.x; accept either.
        parameters = inspect.signature(model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"

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
                        _fail(row.future, error)
                    self._batch = None
        closed = RuntimeError("the hf engine closed before this request finished")
        with self._condition:
            leftovers = [*self._pending, *(self._batch.rows if self._batch else [])]
            self._pending.clear()
            commands, self._commands = self._commands, []
        self._batch = None
        for row in leftovers:
            _fail(row.future, closed)
        for _, future in commands:
            _fail(future, closed)

    def _run_commands(
        self, commands: list[tuple[Callable[[], bool], concurrent.futures.Future[None]]]
    ) -> None:
        for command, future in commands:
            try:
                done = command()
            except Exception as error:
                _fail(future, error)
                continue
            if done:
                _resolve(future, None)
            else:
                with self._condition:
                    self._commands.append((command, future))

    def _admit(self) -> list[_Row]:
        """Waiting rows that can join now (called with the lock held)."""
        capacity = self.max_batch_size - (len(self._batch.rows) if self._batch else 0)
        if capacity <= 0 or not self._pending:
            return []
        version = self._batch.version if self._batch else self._pending[0].request.adapter_version
        if self._pending[0].request.adapter_version != version:
            return []  # the oldest request wants another version: drain the batch first
        admitted: list[_Row] = []
        waiting: deque[_Row] = deque()
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

    @contextmanager
    def _adapter(self, version: int) -> Iterator[None]:
        if version == 0:
            with self._model.disable_adapter() if isinstance(self._model, PeftModel) else nullcontext():
                yield
            return
        if version not in self._adapters:
            raise ValueError(f"adapter version {version} is not loaded")
        self._model.set_adapter(f"v{version}")
        yield

    def _forward(
        self, version: int, cache: Cache, lengths: tuple[list[int], list[int]], **inputs: torch.Tensor
    ) -> torch.Tensor:
        """Logits at each row's last position; ``lengths``: each row's real query and key counts."""
        inputs[self._cache_argument] = cache
        with self._adapter(version), self._invariance(lengths):
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

    def _start_rows(self, rows: list[_Row]) -> None:
        """Prefill new rows, sample their first token and merge the survivors into the batch."""
        version = rows[0].request.adapter_version
        if version != 0 and version not in self._adapters:
            for row in rows:
                _fail(row.future, ValueError(f"adapter version {version} is not loaded"))
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
        cache = Cache(layer_class_to_replicate=_GrowingLayer)
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
        new = _Batch(
            version=version,
            rows=rows,
            cache=cache,
            attention_mask=mask,
            next_positions=torch.tensor([row.next_position for row in rows], device=self.device),
            last_tokens=tokens,
        )
        if len(keep) < len(rows):
            _select(new, keep)
        self._batch = new if self._batch is None else _merge(self._batch, new)

    def _prefill_inputs(self, rows: list[_Row], mask: torch.Tensor) -> dict[str, torch.Tensor]:
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
        lengths = ([1] * len(batch.rows), batch.attention_mask.sum(dim=1).tolist())
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
            _select(batch, keep)

    def _sample(self, rows: list[_Row], logits: torch.Tensor) -> torch.Tensor:
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
                _resolve(row.future, self._result(row))
        return tokens

    def _hit_stop_string(self, row: _Row) -> bool:
        text = self._tokenizer.decode(row.completion_ids, skip_special_tokens=True)
        hits = [index for stop in row.request.stop or [] if stop and (index := text.find(stop)) >= 0]
        if not hits:
            return False
        row.stopped_text = text[: min(hits)]
        return True

    def _result(self, row: _Row) -> GenerationResult:
        ids = row.completion_ids
        if row.stopped_text is not None:
            text = row.stopped_text
        else:
            text_ids = ids[:-1] if ids and ids[-1] in self._stop_ids else ids
            text = self._tokenizer.decode(text_ids, skip_special_tokens=True)
        if row.request.tools and row.request.tool_choice != "none":
            content, tool_calls = parse_tool_calls(text)
        else:
            content, tool_calls = (text or None), []
        return GenerationResult(
            prompt_token_ids=row.prompt_ids,
            completion_token_ids=list(ids),
            completion_logprobs=list(row.logprobs),
            logprobs_mode="raw",
            finish_reason="tool_calls" if tool_calls else (row.finish_reason or "stop"),
            content=content,
            tool_calls=tool_calls,
        )


def _merge(batch: _Batch, new: _Batch) -> _Batch:
    """One batch holding both: the shorter cache is left-padded (masked) to the longer's length."""
    width = max(batch.attention_mask.shape[1], new.attention_mask.shape[1])

    def left_pad(tensor: torch.Tensor, dim_from_end: int) -> torch.Tensor:
        missing = width - tensor.shape[-dim_from_end]
        if missing == 0:
            return tensor
        return F.pad(tensor, (0, 0) * (dim_from_end - 1) + (missing, 0))

    for layer, new_layer in zip(batch.cache.layers, new.cache.layers, strict=True):
        layer.keys = torch.cat([left_pad(layer.keys, 2), left_pad(new_layer.keys, 2)])
        layer.values = torch.cat([left_pad(layer.values, 2), left_pad(new_layer.values, 2)])
    batch.attention_mask = torch.cat([left_pad(batch.attention_mask, 1), left_pad(new.attention_mask, 1)])
    batch.rows = batch.rows + new.rows
    batch.next_positions = torch.cat([batch.next_positions, new.next_positions])
    batch.last_tokens = torch.cat([batch.last_tokens, new.last_tokens])
    return batch


def _select(batch: _Batch, keep: list[int]) -> None:
    """Keep only the rows ``keep``; drop cache columns that are padding for every remaining row."""
    index = torch.tensor(keep, device=batch.attention_mask.device)
    mask = batch.attention_mask[index]
    first = int(mask.any(dim=0).to(torch.int8).argmax())
    for layer in batch.cache.layers:
        layer.keys = layer.keys[index, :, first:]
        layer.values = layer.values[index, :, first:]
    batch.attention_mask = mask[:, first:]
    batch.rows = [batch.rows[i] for i in keep]
    batch.next_positions = batch.next_positions[index]
    batch.last_tokens = batch.last_tokens[index]


def _resolve(future: concurrent.futures.Future[Any], value: Any) -> None:
    if not future.done():
        try:
            future.set_result(value)
        except concurrent.futures.InvalidStateError:  # cancelled by the caller in the meantime
            pass


def _fail(future: concurrent.futures.Future[Any], error: BaseException) -> None:
    if not future.done():
        try:
            future.set_exception(error)
        except concurrent.futures.InvalidStateError:
            pass
