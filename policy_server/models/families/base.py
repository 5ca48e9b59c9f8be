"""What one model family fixes for every engine and the learner: its chat format, its parsers, its
reasoning switch, how it trains and how a tiny copy of it is built offline.

A family is one subclass of :class:`Family` in its own module of this package, registered by name in
``families/__init__.py``. Engines and the learner ask the registry (``family_of(model_dir)``) and
never branch on a family's name themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from policy_server.http.chat_format import parse_tool_calls

# What lora.target_modules' 'all-linear' reaches in a decoder layer of the text families.
ALL_LINEAR_BUT_HEAD = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class TinySizes:
    """The sizes ``rft model tiny`` takes; each family's tiny builder keeps its architecture's own
    proportions (experts, heads, vision tower) and takes these as its scale."""

    vocab_size: int = 1024
    hidden_size: int = 128
    num_layers: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 2048

    def builder_kwargs(self, *, intermediate: bool = True) -> dict[str, int]:
        """The sizes as the tiny builders' keyword arguments (a vision builder sizes its own MLPs)."""
        kwargs = asdict(self)
        if not intermediate:
            del kwargs["intermediate_size"]
        return kwargs


@dataclass(frozen=True)
class VisionParts:
    """Module-name prefixes (transformers 5 layout) of a vision-language model's parts, which the
    learner's LoRA scopes name (``trainer/learner/vision.py``). The defaults are Qwen2-VL's."""

    language_model: str = "model.language_model."
    tower: str = "model.visual."
    # The tower's projectors into the language model (under ``tower``).
    projectors: tuple[str, ...] = ("model.visual.merger.",)


@dataclass(frozen=True)
class ParsedCompletion:
    """A completion split as vLLM's tool-call and reasoning parsers split it."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    reasoning_content: str | None = None


class Family:
    """A model family. The defaults are the hermes/ChatML format (``<tool_call>`` JSON blocks)."""

    name: ClassVar[str] = "hermes"
    # config.json ``model_type`` values this family covers (the vision model's, for a vision family).
    model_types: ClassVar[tuple[str, ...]] = ()
    # vLLM's --tool-call-parser and --reasoning-parser for this family (None: no parser).
    vllm_tool_call_parser: ClassVar[str | None] = "hermes"
    vllm_reasoning_parser: ClassVar[str | None] = None
    # ``reasoning_effort`` values the family's template reads; () means the family has no such switch
    # and a request that sets one is refused with a sentence.
    reasoning_efforts: ClassVar[tuple[str, ...]] = ()
    # The effort a call gets when it sends none, and the tokens the family's reasoning takes at each
    # effort: planning floors, each with its source in docs/models.md (no figure: nothing to say).
    default_reasoning_effort: ClassVar[str | None] = None
    reasoning_tokens: ClassVar[tuple[tuple[str, int], ...]] = ()
    # The attention implementation the learner loads the family with (None: transformers' default).
    train_attn_implementation: ClassVar[str | None] = None
    # Full attention with an output gate (q_proj also projects a sigmoid gate: 2 x heads x head_dim),
    # and, for a hybrid family, every how many layers one is full attention where config.json lists
    # no ``layer_types`` (the rest linear attention; None: no linear layers). What ``rft plan`` counts.
    gated_attention: ClassVar[bool] = False
    full_attention_interval: ClassVar[int | None] = None
    vision: ClassVar[bool] = False
    vision_parts: ClassVar[VisionParts] = VisionParts()
    # LoRA target modules vLLM cannot sample as the learner computes them: served with other
    # logprobs, or an adapter on them refused at load. A run sampled by vLLM leaves them out.
    vllm_mismatched_lora_modules: ClassVar[tuple[str, ...]] = ()
    vllm_unloadable_lora_modules: ClassVar[tuple[str, ...]] = ()
    # vLLM's CPU build: the one dtype it runs this family's layers in (None: any, and rftkit serves
    # float32 there, as the learner computes) and the server arguments the family needs there.
    vllm_cpu_dtype: ClassVar[str | None] = None
    vllm_cpu_args: ClassVar[tuple[str, ...]] = ()
    # CPU flags (/proc/cpuinfo's names) of which that build needs one to run this family's kernels
    # (empty: it runs them on any x86-64 CPU it supports).
    vllm_cpu_flags: ClassVar[tuple[str, ...]] = ()
    # vLLM renders and parses this family with openai-harmony: a server for it needs harmony's o200k
    # vocabulary and a pinned conversation date (policy_server/engines/vllm_command.py).
    vllm_harmony: ClassVar[bool] = False

    def parsing_for(self, chat_template_kwargs: Mapping[str, Any]) -> Family:
        """The family that parses a request sent with these ``chat_template_kwargs``: this one, or a
        variant where vLLM's parser reads a switch there (Qwen3's ``enable_thinking``)."""
        return self

    def with_tools(self, tools: Sequence[Mapping[str, Any]] | None) -> Family:
        """The family that parses a request offering ``tools``: this one, or a variant that types call
        arguments by the tools' schemas where vLLM's parser does (Gemma 4's)."""
        return self

    def parse(self, tokenizer: Any, completion_ids: Sequence[int], *, tools: bool) -> ParsedCompletion:
        """What vLLM's parsers for this family return for these sampled tokens (stop token excluded).

        ``tools``: the request offered tools (and did not set ``tool_choice: none``).
        """
        return self.parse_text(tokenizer.decode(list(completion_ids), skip_special_tokens=True), tools=tools)

    def parse_text(self, text: str, *, tools: bool) -> ParsedCompletion:
        """:meth:`parse` for a completion known only as text (one cut at a stop string)."""
        if not tools:
            return ParsedCompletion(content=text or None)
        content, tool_calls = parse_tool_calls(text)
        return ParsedCompletion(content=content, tool_calls=tool_calls)

    def reasoning_effort_refusal(self, effort: Any) -> str | None:
        """Why a request's ``reasoning_effort`` cannot reach this family's template (a sentence), or None."""
        if not self.reasoning_efforts:
            return (
                f"The served model's family ({self.name}) has no reasoning_effort switch; "
                "leave reasoning_effort unset."
            )
        if effort not in self.reasoning_efforts:
            return (
                f"reasoning_effort {effort!r} is not one the {self.name} family reads; "
                f"use one of: {', '.join(self.reasoning_efforts)}."
            )
        return None

    def reasoning_budget_note(self, effort: str | None, max_completion_length: int) -> str | None:
        """A sentence when ``max_completion_length`` is below what this family's reasoning takes at
        ``effort`` (None: the family's default effort), else None."""
        chosen = effort or self.default_reasoning_effort
        need = dict(self.reasoning_tokens).get(chosen) if chosen else None
        if need is None or max_completion_length >= need:
            return None
        lower = [name for name, tokens in self.reasoning_tokens if tokens <= max_completion_length]
        default = "" if effort else ", the family's default (reasoning_effort unset)"
        return (
            f"max_completion_length {max_completion_length} is below the {need} tokens the {self.name} "
            f"family's reasoning takes at reasoning_effort {chosen}{default} (docs/models.md): calls "
            f"may end mid-reasoning with no answer; raise max_completion_length to {need}"
            + (f", or set reasoning_effort: {lower[-1]}" if lower else "")
        )

    def vllm_lora_refusal(self, target_modules: Sequence[str] | str) -> str | None:
        """Why vLLM cannot sample an adapter on ``target_modules`` as the learner computes it (a
        sentence naming the modules and what to set), or None. ``all-linear`` (a string) reaches
        every projection of a decoder layer, not the embeddings or the output head."""
        asked = list(ALL_LINEAR_BUT_HEAD) if isinstance(target_modules, str) else list(target_modules)
        mismatched = [m for m in self.vllm_mismatched_lora_modules if m in asked]
        unloadable = [m for m in self.vllm_unloadable_lora_modules if m in asked]
        if not mismatched and not unloadable:
            return None
        why = [f"{', '.join(mismatched)}: served with other logprobs"] if mismatched else []
        why += [f"{', '.join(unloadable)}: the adapter refused at load"] if unloadable else []
        keep = [m for m in asked if m not in mismatched + unloadable]
        listed = target_modules if isinstance(target_modules, str) else ", ".join(target_modules)
        them = "it" if len(mismatched + unloadable) == 1 else "them"
        return (
            f"vLLM cannot sample a LoRA on {', '.join(mismatched + unloadable)} of the {self.name} "
            f"family as the learner computes it ({'; '.join(why)}; docs/models.md, {self.name}), and "
            f"lora.target_modules is {listed}: leave {them} out, e.g. lora.target_modules: "
            f"[{', '.join(keep)}], or sample with engine: hf."
        )

    def vllm_cpu_dtype_refusal(self, dtype: str) -> str | None:
        """Why vLLM's CPU build cannot serve this family in ``dtype`` (a sentence naming the setting),
        or None. ``auto`` is always served: rftkit then picks the family's CPU dtype."""
        if self.vllm_cpu_dtype is None or dtype in ("auto", self.vllm_cpu_dtype):
            return None
        return (
            f"vLLM's CPU build runs the {self.name} family in {self.vllm_cpu_dtype} only "
            f"(docs/models.md, {self.name}), and vllm.dtype is {dtype}: set vllm.dtype to auto or "
            f"{self.vllm_cpu_dtype} (rft serve: --dtype), or sample with engine: hf."
        )

    def vllm_cpu_flags_refusal(self, usable: bool | None) -> str | None:
        """Why vLLM's CPU build cannot run this family's kernels here (a sentence), or None.
        ``usable``: whether oneDNN may use one of :attr:`vllm_cpu_flags` on this CPU (None: unknown)."""
        if not self.vllm_cpu_flags or usable is not False:
            return None
        return (
            f"vLLM's CPU build runs the {self.name} family's {self.vllm_cpu_dtype or 'float'} kernels "
            f"only where oneDNN may use {' or '.join(self.vllm_cpu_flags)} (docs/models.md, {self.name}), "
            "and this CPU has neither or ONEDNN_MAX_CPU_ISA caps it below them: sample with engine: hf, "
            "or run vLLM on a GPU or on such a CPU."
        )

    def build_tiny(
        self, out: Path, *, seed: int = 0, corpus: Sequence[str] = (), sizes: TinySizes = TinySizes()
    ) -> Path:
        """Write a tiny, randomly initialised model of this family to ``out`` (offline). Every registered
        family builds one; only the fallback for models no family covers (``HERMES``) has no
        architecture of its own to build."""
        raise ValueError(
            f"the {self.name} fallback has no architecture of its own to build a tiny model of: "
            "name a registered family (rft model tiny DIR --family NAME)"
        )
