"""Memory estimates of a decoder-only transformer from its ``config.json`` alone (no weights loaded).

Covers the Llama family's shape (Llama, Mistral, Qwen2/2.5/3, SmolLM, Gemma's dense layers) and
mixture-of-experts layers (``num_local_experts``/``num_experts``, every layer sparse: gpt-oss,
Qwen3-MoE), enough to say before a run whether it fits. Parameter counts are exact for those layouts
up to norms and biases; activation memory is an estimate (what a transformer layer keeps for its
backward pass with a fused attention kernel, which keeps no [T, T] matrix; a family that trains with
eager attention keeps one per layer, :meth:`ModelShape.eager_attention_bytes`), meant to be within
tens of percent, not bytes. LoRA on experts: :meth:`ModelShape.adapted_experts`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GB = 1e9
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# The LoRA projections a peft "all-linear" adapter wraps in these layouts (the output head excluded).
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Each trained LoRA parameter: its float32 value, gradient and AdamW's two moments.
LORA_TRAINING_BYTES = 16
# Model types whose experts peft (0.21, on transformers 5) adapts from target_modules, as it did when
# they were nn.Linear modules in transformers 4: the fused gate_up stack at twice the rank, the
# down stack, and the router's weight under 'all-linear'.
PEFT_CONVERTED_EXPERTS = ("qwen3_moe",)


class ModelShapeError(ValueError):
    """A config.json that lacks a size the estimate needs."""


def _first(config: dict[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if config.get(name) is not None:
            return config[name]
    if default is None:
        raise ModelShapeError(f"config.json has none of {', '.join(names)}: cannot estimate the model's size")
    return default


@dataclass(frozen=True)
class AdaptedStack:
    """A stacked parameter LoRA adapts as peft's ``target_parameters`` do (an expert stack, or a
    router's weight): each of its ``experts`` matrices of (in, out) features gets rank-``rank`` factors."""

    name: str
    features_in: int
    features_out: int
    rank: int
    experts: int

    @property
    def lora_parameters(self) -> int:
        return self.rank * self.experts * (self.features_in + self.features_out)

    @property
    def weights(self) -> int:
        """The stack's size: what peft rebuilds (W + BA) on each forward while it is adapted."""
        return self.experts * self.features_in * self.features_out


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that its memory depends on."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    attention_bias: bool = False
    experts: int = 0  # 0: a dense MLP
    experts_per_token: int = 0
    dtype: str = "bfloat16"  # the checkpoint's own dtype (vLLM's --dtype auto)
    max_positions: int = 0  # the model's own context length; 0: not said
    model_type: str = ""  # config.json's model_type
    eager_attention: bool = False  # the family trains with eager attention ([T, T] scores kept)

    @classmethod
    def from_config(cls, config: dict[str, Any], eager_attention: bool = False) -> ModelShape:
        """Read the sizes from a transformers config.json (a VLM's ``text_config`` when present).
        ``eager_attention``: the model's family trains with eager attention."""
        text = config.get("text_config") or config
        hidden = int(_first(text, "hidden_size", "n_embd", "d_model"))
        heads = int(_first(text, "num_attention_heads", "n_head"))
        experts = int(_first(text, "num_local_experts", "num_experts", "n_routed_experts", default=0))
        dense = int(_first(text, "intermediate_size", "n_inner", default=4 * hidden))
        dtype = str(_first(text, "dtype", "torch_dtype", default="bfloat16"))
        return cls(
            hidden=hidden,
            layers=int(_first(text, "num_hidden_layers", "n_layer")),
            heads=heads,
            kv_heads=int(_first(text, "num_key_value_heads", default=heads)),
            head_dim=int(_first(text, "head_dim", default=hidden // heads)),
            intermediate=int(_first(text, "moe_intermediate_size", default=dense)) if experts else dense,
            vocab=int(_first(text, "vocab_size")),
            tied_embeddings=bool(_first(config, "tie_word_embeddings", default=False)),
            # Qwen2/2.5 carry q/k/v biases without saying so in the config.
            attention_bias=bool(text.get("attention_bias") or text.get("model_type") == "qwen2"),
            experts=experts,
            experts_per_token=int(_first(text, "num_experts_per_tok", "experts_per_token", default=0)),
            dtype=dtype if dtype in DTYPE_BYTES else "bfloat16",
            max_positions=int(_first(text, "max_position_embeddings", "n_positions", default=0)),
            model_type=str(config.get("model_type", "")),
            eager_attention=eager_attention,
        )

    @classmethod
    def from_model_dir(cls, directory: str | Path) -> ModelShape:
        """:meth:`from_config` of the directory's config.json, with its family's training attention."""
        from policy_server.models.families import family_of

        path = Path(directory) / "config.json"
        if not path.is_file():
            raise ModelShapeError(f"{directory} has no config.json: the plan needs the model's sizes")
        family = family_of(directory)
        eager = family is not None and family.train_attn_implementation == "eager"
        return cls.from_config(json.loads(path.read_text(encoding="utf-8")), eager_attention=eager)

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each projection of one layer (one expert's for MoE MLPs)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (self.hidden, q),
            "k_proj": (self.hidden, kv),
            "v_proj": (self.hidden, kv),
            "o_proj": (q, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }

    def parameters(self) -> int:
        """Parameter count: embeddings, layers (attention, MLP or experts + router, norms), head."""
        shapes = self.linear_shapes()
        attention = sum(i * o for name, (i, o) in shapes.items() if name in ALL_LINEAR[:4])
        if self.attention_bias:
            attention += shapes["q_proj"][1] + 2 * shapes["k_proj"][1]
        mlp = sum(i * o for name, (i, o) in shapes.items() if name in ALL_LINEAR[4:])
        if self.experts:
            mlp = self.experts * mlp + self.hidden * self.experts
        per_layer = attention + mlp + 2 * self.hidden
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * per_layer + embeddings + self.hidden

    def active_parameters(self) -> int:
        """The weights one token's forward pass multiplies by: a mixture of experts' router's
        ``experts_per_token`` experts of each layer, not all of them; the input embedding is a
        lookup, not counted (as OpenAI counts gpt-oss-20b's 3.61 B active of 20.91 B)."""
        idle = max(self.experts - self.experts_per_token, 0) if self.experts else 0
        idle_experts = self.layers * idle * 3 * self.hidden * self.intermediate
        return self.parameters() - idle_experts - self.vocab * self.hidden

    def lora_parameters(
        self, rank: int, targets: Iterable[str] | str, target_parameters: Sequence[str] = ()
    ) -> int:
        """Parameters of a LoRA adapter of ``rank`` on ``targets`` (names, or "all-linear") and on
        the stacked parameters ``target_parameters`` names (:meth:`adapted_experts`).

        peft's "all-linear" wraps nn.Linear modules only: fused expert weights are parameters, not
        modules, so an MoE's experts get no adapter from it, except where peft converts the names
        (``PEFT_CONVERTED_EXPERTS``).
        """
        per_layer = sum(rank * (i + o) for i, o in self.adapted_modules(targets))
        stacks = self.adapted_experts(rank, targets, target_parameters)
        return self.layers * (per_layer + sum(stack.lora_parameters for stack in stacks))

    def adapted_experts(
        self, rank: int, targets: Iterable[str] | str, target_parameters: Sequence[str] = ()
    ) -> list[AdaptedStack]:
        """The stacked parameters of one layer a LoRA adapter reaches: the expert stacks
        ``target_parameters`` names (by their last name, e.g. ``mlp.experts.gate_up_proj``) and, for
        ``PEFT_CONVERTED_EXPERTS``, those peft maps ``targets`` onto (gate_proj and up_proj: the
        gate_up stack at twice the rank; down_proj; the router's weight, 'gate', under 'all-linear')."""
        if not self.experts:
            return []
        shapes = {
            "gate_up_proj": (self.hidden, 2 * self.intermediate, self.experts),
            "down_proj": (self.intermediate, self.hidden, self.experts),
            "gate": (self.hidden, self.experts, 1),
        }
        ranks = {leaf: rank for name in target_parameters if (leaf := name.rpartition(".")[2]) in shapes}
        ranks.pop("gate", None)  # a router is named as gate.weight, which rftkit does not count
        if self.model_type in PEFT_CONVERTED_EXPERTS:
            named = set(ALL_LINEAR) | {"gate"} if targets == "all-linear" else set(targets)
            if {"gate_proj", "up_proj"} <= named:
                ranks["gate_up_proj"] = 2 * rank
            ranks.update({name: rank for name in ("down_proj", "gate") if name in named})
        return [
            AdaptedStack(name, *shapes[name][:2], rank=ranks[name], experts=shapes[name][2]) for name in ranks
        ]

    def expert_lora_bytes(
        self,
        rank: int,
        targets: Iterable[str] | str,
        target_parameters: Sequence[str],
        dtype_bytes: int,
        checkpointing: bool,
    ) -> int:
        """What LoRA on stacked parameters keeps in the update: peft rebuilds each adapted stack in
        full (W + BA, in the model's dtype) on every forward, and the backward keeps it; each layer
        keeps its own (with checkpointing, only the layer being recomputed), and the backward holds
        one layer's stacks' gradient besides."""
        stacks = self.adapted_experts(rank, targets, target_parameters)
        per_layer = sum(stack.weights for stack in stacks) * dtype_bytes
        return per_layer * ((1 if checkpointing else self.layers) + 1)

    def eager_attention_bytes(self, tokens: int, dtype_bytes: int, checkpointing: bool) -> int:
        """Eager attention's [rows, heads, T, T] scores of one micro-batch of ``tokens`` tokens, at
        their largest: rows of the longest length T the model takes (at most ``tokens``). Each layer
        keeps its softmax for the backward (with checkpointing, only the layer being recomputed); the
        layer being run holds two more of that size (its raw scores; in the backward, their gradient)."""
        longest = min(tokens, self.max_positions) if self.max_positions else tokens
        per_layer = tokens * self.heads * longest * dtype_bytes  # rows x heads x T x T, rows = tokens / T
        return per_layer * ((1 if checkpointing else self.layers) + 2)

    def adapted_modules(self, targets: Iterable[str] | str) -> list[tuple[int, int]]:
        """(in, out) features of each module of one layer a LoRA adapter on ``targets`` wraps."""
        wanted = set(ALL_LINEAR if targets == "all-linear" else targets)
        if self.experts and targets == "all-linear":
            wanted -= {"gate_proj", "up_proj", "down_proj"}
        return [shape for name, shape in self.linear_shapes().items() if name in wanted]

    def lora_activation_bytes(
        self,
        tokens: int,
        rank: int,
        targets: Iterable[str] | str,
        dtype_bytes: int,
        checkpointing: bool,
        dropout: bool = False,
    ) -> int:
        """What peft's LoRA keeps for its backward pass in one micro-batch of ``tokens`` tokens, on
        top of :meth:`activation_bytes`: per adapted module and token,

        - the input lora_A keeps for its weight gradient: peft casts the layer's input to the
          adapter's float32, a copy of ``in`` features x 4 bytes in a bf16/fp16 model (in a float32
          model, without dropout, it is the layer's input itself, already counted);
        - lora_A's output, which lora_B keeps: ``rank`` x 4 bytes;
        - with LoRA dropout, its mask (``in`` x 1 byte) and its float32 output (what lora_A keeps).

        Every layer keeps them; with checkpointing only the layer being recomputed does.
        """
        per_layer = 0
        for features, _ in self.adapted_modules(targets):
            copy = features * 4 if dtype_bytes != 4 or dropout else 0
            per_layer += copy + rank * 4 + (features if dropout else 0)
        return tokens * per_layer * (1 if checkpointing else self.layers)

    def update_extras(
        self,
        tokens: int,
        rank: int,
        targets: Iterable[str] | str,
        target_parameters: Sequence[str],
        dtype_bytes: int,
        checkpointing: bool,
    ) -> list[tuple[str, int]]:
        """What the update holds besides :meth:`activation_bytes` where LoRA adapts stacked
        parameters or the family trains with eager attention: (label, bytes) for the plan."""
        extras = []
        stacks = self.adapted_experts(rank, targets, target_parameters)
        if stacks:
            names = ", ".join(stack.name for stack in stacks)
            extras.append(
                (
                    f"stacks rebuilt with LoRA for the backward ({names})",
                    self.expert_lora_bytes(rank, targets, target_parameters, dtype_bytes, checkpointing),
                )
            )
        if self.eager_attention:
            extras.append(
                (
                    f"eager attention scores ([rows, {self.heads} heads, T, T] per layer)",
                    self.eager_attention_bytes(tokens, dtype_bytes, checkpointing),
                )
            )
        return extras

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV cache bytes one token takes across all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def activation_bytes(self, tokens: int, dtype_bytes: int, checkpointing: bool) -> int:
        """Activations kept for the backward pass of one micro-batch of ``tokens`` tokens.

        Per token and layer a layer keeps its input and norms (~4 hidden), q and the attention
        output (2 x heads x head_dim), k and v, and the MLP's gate, up, activation and product
        (4 x intermediate, times the experts each token visits). With checkpointing only each
        layer's input stays, plus one layer's worth while it is recomputed.
        """
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        mlp = 4 * self.intermediate * max(self.experts_per_token, 1)
        per_layer = 4 * self.hidden + 2 * q + 2 * kv + mlp
        # One more layer's worth: the gradients flowing back through the layer being differentiated.
        kept = self.layers * self.hidden + 2 * per_layer if checkpointing else (self.layers + 1) * per_layer
        return tokens * kept * dtype_bytes

    def logits_bytes(self, positions: int, dtype_bytes: int) -> int:
        """The output head's working set for ``positions`` positions: logits in the model's dtype,
        their float32 copy, the softmax of the entropy and the float32 gradient."""
        return positions * self.vocab * (dtype_bytes + 3 * 4)
