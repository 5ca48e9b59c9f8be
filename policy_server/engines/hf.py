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
sampled. Tool calls (when the request has tools and ``tool_choice`` is not "none") and reasoning are
parsed as vLLM's parsers for the model's family parse them (``policy_server/models/families``), or as
the family whose parser an explicit ``tool_call_parser`` names; other ``tool_choice`` values are not
enforced (no guided decoding).
Sampling is seeded per request: ``request.seed``, or the engine's seed plus a counter. With
``batch_invariant`` (the default on the CPU) a row's logits do not depend on which rows share its batch
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from peft.tuners.tuners_utils import BaseTunerLayer
from transformers import AutoConfig

from policy_server.engines import batch_invariant
from policy_server.engines.base import EngineOccupancy, GenerationRequest, GenerationResult, prompt_too_long
from policy_server.engines.hf_batch import Batch, Row
from policy_server.engines.hf_decode import DecodeLoop
from policy_server.http.chat_format import normalize_messages
from policy_server.models.chat_templates import chat_template_path, load_tokenizer
from policy_server.models.families import AUTO, parsing_family, resolve_parsers
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


def _validate(request: GenerationRequest) -> None:
    if request.max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {request.max_tokens}")
    if request.temperature < 0:
        raise ValueError(f"temperature must be 0 or more, got {request.temperature}")
    if not 0 < request.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {request.top_p}")
    if not request.messages:
        raise ValueError("messages must not be empty")
    if request.tool_choice not in (None, "auto", "none"):
        raise ValueError(
            "tool_choice 'required' or a named function is not enforced by the hf engine (it has no "
            "guided decoding); send 'auto' and check the reply, or serve with the vllm engine"
        )


def default_batch_invariant(device: str | torch.device) -> bool:
    """Whether the engine computes rows batch-invariantly unless told: on the CPU only.

    On CUDA it buys no invariance (cuBLAS picks its kernels by shape, which the row padding does not
    fix) and costs one attention call per row per layer plus a copy of each row's KV cache per step.
    """
    return torch.device(device).type == "cpu"


class HFEngine(DecodeLoop):
    """An in-process engine on transformers + peft (CPU or a small GPU)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        max_batch_size: int = 64,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
        batch_invariant: bool | None = None,
        chat_template: str | Path | None = None,
        tool_call_parser: str | None = AUTO,
        reasoning_parser: str | None = AUTO,
    ) -> None:
        """``batch_invariant``: unset, on for the CPU and off on CUDA (:func:`default_batch_invariant`).

        ``tool_call_parser`` and ``reasoning_parser`` are vLLM's parser names (None: none; ``auto``:
        the model family's): completions are parsed as the family whose vLLM tool-call parser has
        that name parses them, so both engines return the same fields (``families.parsing_family``).
        """
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.model_dir = Path(model_dir)
        self.model_name = self.model_dir.name
        self.max_batch_size = max_batch_size
        self.device = torch.device(device)
        self.dtype = dtype
        # A row's logits are the same to the last bit whichever rows share its batch (see
        # batch_invariant.py), so seeded requests sample the same tokens however agents are timed.
        self.batch_invariant = (
            default_batch_invariant(self.device) if batch_invariant is None else batch_invariant
        )
        self.stats = EngineStats()
        # Checked now, so a bad setting fails before the model loads; applied to the tokenizer in _load.
        self._chat_template = chat_template_path(chat_template) if chat_template is not None else None
        self._parser_settings = (tool_call_parser, reasoning_parser)
        self._parse_tools = True
        self._seeds = itertools.count(seed << 32)
        self._tokenizer: Any = None
        self._vision: VisionInputs | None = None
        self._model: Any = None  # the base model, or the PeftModel wrapping it once an adapter is loaded
        self._adapters: set[int] = set()
        self._stop_ids: set[int] = set()
        self._max_positions = 0
        self._longest_token_chars = 1
        self._min_rows = 0
        self._cache_argument = "past_key_values"
        self._condition = threading.Condition()
        self._pending: deque[Row] = deque()
        self._commands: list[tuple[Callable[[], bool], concurrent.futures.Future[None]]] = []
        self._batch: Batch | None = None
        self._closing = False
        self._served: int | None = None
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
        # Refused before rendering: tokenising a prompt of megabytes would take seconds and gigabytes.
        too_long = prompt_too_long(request, self._max_positions, self._longest_token_chars)
        if too_long is not None:
            raise ValueError(too_long)
        prompt_ids, pixels = await asyncio.to_thread(self._render, request)
        room = self._max_positions - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"the prompt is {len(prompt_ids)} tokens, which leaves no room in the model's "
                f"{self._max_positions}-token context"
            )
        seed = request.seed if request.seed is not None else next(self._seeds)
        row = Row(
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
        parsers = resolve_parsers(self.model_dir, *self._parser_settings)  # a refusal costs no load
        self._family = parsing_family(parsers)
        self._parse_tools = parsers.tool_call is not None
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
        self._longest_token_chars = max(len(token) for token in self._tokenizer.get_vocab())
        self._min_rows = batch_invariant.min_gemm_rows()
        if self.batch_invariant:
            batch_invariant.pad_rows(self._model, self._min_rows)
        # transformers renamed `past_key_values` to `cache` during 5.x; accept either.
        parameters = inspect.signature(model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"
