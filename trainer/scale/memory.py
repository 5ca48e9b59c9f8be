"""Memory estimates of a decoder-only transformer from its ``config.json`` alone (no weights loaded).

Covers the Llama family's shape (Llama, Mistral, Qwen2/2.5/3, SmolLM, Gemma's dense layers),
mixture-of-experts layers (``num_local_experts``/``num_experts``, every layer sparse: gpt-oss,
Qwen3-MoE; with a shared expert: Qwen 3.5/3.6 MoE) and hybrid models whose ``layer_types`` mix linear
attention into full attention (Qwen 3.5/3.6: :mod:`trainer.scale.hybrid`), enough to say before a run
whether it fits. Parameter counts are exact for those layouts up to norms and biases (Qwen 3.5/3.6's:
exact); activation memory is an estimate (what a transformer layer keeps for its backward pass with a
fused attention kernel, which keeps no [T, T] matrix; a family that trains with eager attention keeps
one per layer, :meth:`ModelShape.eager_attention_bytes`), meant to be within tens of percent, not
bytes. LoRA on experts: :meth:`ModelShape.adapted_experts`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.scale.experts import PEFT_CONVERTED_EXPERTS, AdaptedStack
from trainer.scale.hybrid import LinearAttention, linear_layer_count
from trainer.scale.quantization import Quantization
from trainer.scale.vision import vision_tower_parameters

GB = 1e9
# Per process and GPU: the CUDA context, cuBLAS workspaces and the caching allocator's slack.
CUDA_OVERHEAD_BYTES = int(1.0 * GB)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# The LoRA projections a peft "all-linear" adapter wraps in these layouts (the output head excluded).
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Each trained LoRA parameter: its float32 value, gradient and AdamW's two moments.
LORA_TRAINING_BYTES = 16
# Training attentions that compute the softmax a block of queries at a time (never a whole [T, T]),
# by their attn_implementation name, with their block's queries: rftkit's chunked attention
# (policy_server/models/chunked_attention.py, QUERY_CHUNK). What their working scores take is
# :meth:`ModelShape.attention_block_bytes`. Kept here, not imported, so the plan needs no torch
# (tests/trainer/test_chunked_attention.py checks the two agree).
BLOCKWISE_ATTENTION = {"rftkit_chunked": 128}


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
    attention_block: int = 0  # queries per block of a block-wise training attention; 0: none
    shared_expert_intermediate: int = 0  # a shared expert's width beside the routed experts; 0: none
    gated_attention: bool = False  # q_proj also outputs a gate (2 x heads x head_dim), q/k norms
    linear: LinearAttention | None = None  # the linear-attention layers' sizes (hybrid models)
    linear_layers: int = 0  # how many of ``layers`` are linear attention; the rest full attention
    sliding_layers: int = 0  # how many full-attention layers attend to the last ``sliding_window`` only
    sliding_window: int = 0
    global_kv_heads: int = 0  # the global (not sliding) layers' own KV heads and head size, where the
    global_head_dim: int = 0  # config gives them apart (Gemma 4); 0: as every layer's
    keys_as_values: bool = False  # the global layers reuse their keys as values (no v_proj)
    quantization: Quantization | None = None  # how the checkpoint stores its weights (what vLLM serves)
    vision_parameters: int = 0  # a vision-language checkpoint's vision tower, beside parameters()

    @classmethod
    def from_config(
        cls, config: dict[str, Any], eager_attention: bool = False, attention_block: int = 0
    ) -> ModelShape:
        """Read the sizes from a transformers config.json (a VLM's ``text_config`` when present).
        ``eager_attention``: the model's family trains with eager attention; ``attention_block``: with
        a block-wise attention of that many queries a block."""
        text = config.get("text_config") or config
        hidden = int(_first(text, "hidden_size", "n_embd", "d_model"))
        heads = int(_first(text, "num_attention_heads", "n_head"))
        experts = int(_first(text, "num_local_experts", "num_experts", "n_routed_experts", default=0))
        dense = int(_first(text, "intermediate_size", "n_inner", default=4 * hidden))
        dtype = str(_first(text, "dtype", "torch_dtype", default="bfloat16"))
        from policy_server.models.families import family_for_model_type

        found = family_for_model_type(str(config.get("model_type", "")))
        layers = int(_first(text, "num_hidden_layers", "n_layer"))
        linear_layers = linear_layer_count(text, found.full_attention_interval if found else None, layers)
        linear = LinearAttention.from_config(lambda name: int(_first(text, name))) if linear_layers else None
        shared = int(_first(text, "shared_expert_intermediate_size", default=0)) if experts else 0
        sliding = sum(kind == "sliding_attention" for kind in text.get("layer_types") or ())
        return cls(
            hidden=hidden,
            layers=layers,
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
            attention_block=attention_block,
            shared_expert_intermediate=shared,
            gated_attention=found is not None and found.gated_attention,
            linear=linear,
            linear_layers=linear_layers,
            sliding_layers=sliding if text.get("sliding_window") else 0,
            sliding_window=int(text.get("sliding_window") or 0) if sliding else 0,
            global_kv_heads=int(text.get("num_global_key_value_heads") or 0),
            global_head_dim=int(text.get("global_head_dim") or 0),
            keys_as_values=bool(text.get("attention_k_eq_v")),
            quantization=Quantization.from_config(config),
            vision_parameters=vision_tower_parameters(config.get("vision_config")),
        )

    @classmethod
    def from_model_dir(cls, directory: str | Path) -> ModelShape:
        """:meth:`from_config` of the directory's config.json, with its family's training attention."""
        from policy_server.models.families import family_of

        path = Path(directory) / "config.json"
        if not path.is_file():
            raise ModelShapeError(f"{directory} has no config.json: the plan needs the model's sizes")
        family = family_of(directory)
        attention = family.train_attn_implementation if family is not None else None
        return cls.from_config(
            json.loads(path.read_text(encoding="utf-8")),
            eager_attention=attention == "eager",
            attention_block=BLOCKWISE_ATTENTION.get(attention or "", 0),
        )

    @property
    def full_layers(self) -> int:
        """The layers with full attention (q/k/v/o, a KV cache): all but the linear ones."""
        return self.layers - self.linear_layers

    def layer_kinds(self) -> list[tuple[int, bool]]:
        """(how many layers, whether linear attention) for each kind of layer the model has."""
        kinds = [(self.full_layers, False), (self.linear_layers, True)]
        return [(count, linear) for count, linear in kinds if count]

    def linear_shapes(self, linear: bool = False) -> dict[str, tuple[int, int]]:
        """(in, out) features of each projection of one full-attention layer (``linear``: of one
        linear-attention layer); the MLP's are one expert's for MoE MLPs, or the shared expert's (and
        its gate's) where the model has one, as those are the nn.Linear modules there."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        if linear and self.linear is not None:
            mixer = self.linear.linear_shapes(self.hidden)
        else:
            mixer = {
                "q_proj": (self.hidden, 2 * q if self.gated_attention else q),
                "k_proj": (self.hidden, kv),
                "v_proj": (self.hidden, kv),
                "o_proj": (q, self.hidden),
            }
        width = self.shared_expert_intermediate or self.intermediate
        mlp = {
            "gate_proj": (self.hidden, width),
            "up_proj": (self.hidden, width),
            "down_proj": (width, self.hidden),
        }
        if self.shared_expert_intermediate:
            mlp["shared_expert_gate"] = (self.hidden, 1)
        return {**mixer, **mlp}

    def _attention_parameters(self) -> int:
        """One full-attention layer's q/k/v/o, their biases and (gated attention) its q/k norms."""
        shapes = self.linear_shapes()
        attention = sum(i * o for name, (i, o) in shapes.items() if name in ALL_LINEAR[:4])
        if self.attention_bias:
            attention += shapes["q_proj"][1] + 2 * shapes["k_proj"][1]
        return attention + (2 * self.head_dim if self.gated_attention else 0)

    @property
    def global_layers(self) -> int:
        """The full-attention layers with heads of their own (Gemma 4's global layers), 0 where every
        full-attention layer has the same."""
        return self.full_layers - self.sliding_layers if self.global_head_dim or self.global_kv_heads else 0

    def _global_attention_extra(self) -> int:
        """What one global layer's q/k/v/o have beyond :meth:`_attention_parameters`."""
        width = self.global_head_dim or self.head_dim
        kv = (self.global_kv_heads or self.kv_heads) * width
        own = 2 * self.hidden * self.heads * width + self.hidden * kv * (1 if self.keys_as_values else 2)
        return own - self._attention_parameters()

    def parameters(self) -> int:
        """Parameter count: embeddings, layers (attention or linear attention, MLP or experts + router
        and a shared expert with its gate, norms), head."""
        mlp = 3 * self.hidden * self.intermediate
        if self.experts:
            mlp = self.experts * mlp + self.hidden * self.experts
            if self.shared_expert_intermediate:
                mlp += 3 * self.hidden * self.shared_expert_intermediate + self.hidden
        mixers = self.full_layers * self._attention_parameters()
        mixers += self.global_layers * self._global_attention_extra() if self.global_layers else 0
        if self.linear is not None:
            mixers += self.linear_layers * self.linear.parameters(self.hidden)
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return mixers + self.layers * (mlp + 2 * self.hidden) + embeddings + self.hidden

    def active_parameters(self) -> int:
        """The weights one token's forward pass multiplies by: a mixture of experts' router's
        ``experts_per_token`` experts of each layer, not all of them; the input embedding is a
        lookup, not counted (as OpenAI counts gpt-oss-20b's 3.61 B active of 20.91 B), unless it is
        tied to the output head, which multiplies by it."""
        idle = max(self.experts - self.experts_per_token, 0) if self.experts else 0
        idle_experts = self.layers * idle * 3 * self.hidden * self.intermediate
        lookup = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.parameters() - idle_experts - lookup

    def lora_parameters(
        self, rank: int, targets: Iterable[str] | str, target_parameters: Sequence[str] = ()
    ) -> int:
        """Parameters of a LoRA adapter of ``rank`` on ``targets`` (names, or "all-linear") and on
        the stacked parameters ``target_parameters`` names (:meth:`adapted_experts`).

        peft's "all-linear" wraps nn.Linear modules only: fused expert weights are parameters, not
        modules, so an MoE's experts get no adapter from it, except where peft converts the names
        (``PEFT_CONVERTED_EXPERTS``).
        """
        modules = sum(
            count * sum(rank * (i + o) for i, o in self.adapted_modules(targets, linear))
            for count, linear in self.layer_kinds()
        )
        stacks = self.adapted_experts(rank, targets, target_parameters)
        return modules + self.layers * sum(stack.lora_parameters for stack in stacks)

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

    def eager_attention_bytes(self, tokens: int, dtype_bytes: int, checkpointing: bool) -> int:
        """Eager attention's [rows, heads, T, T] scores of one micro-batch of ``tokens`` tokens, at
        their largest: rows of the longest length T the model takes (at most ``tokens``). Each layer
        keeps its softmax for the backward (with checkpointing, only the layer being recomputed); the
        layer being run holds two more of that size (its raw scores; in the backward, their gradient)."""
        longest = min(tokens, self.max_positions) if self.max_positions else tokens
        per_layer = tokens * self.heads * longest * dtype_bytes  # rows x heads x T x T, rows = tokens / T
        return per_layer * ((1 if checkpointing else self.layers) + 2)

    def attention_block_bytes(self, tokens: int) -> int:
        """A block-wise attention's working scores for a micro-batch of ``tokens`` tokens, one layer at
        a time (each block is recomputed in the backward, nothing kept across layers): a block's
        float32 scores are ``rows x heads x block x keys`` (keys at most T, rows x T = ``tokens``), and
        its softmax and backward hold four of them (scores, probabilities and their gradients)."""
        return 4 * tokens * self.heads * self.attention_block * 4 if self.attention_block else 0

    def adapted_modules(self, targets: Iterable[str] | str, linear: bool = False) -> list[tuple[int, int]]:
        """(in, out) features of each module of one full-attention layer (``linear``: linear-attention
        layer) a LoRA adapter on ``targets`` wraps. "all-linear" reaches every nn.Linear there: a
        linear layer's projections (``hybrid.LINEAR_ATTENTION_MODULES``), a shared expert and its gate, not
        the conv1d nor fused experts."""
        shapes = self.linear_shapes(linear)
        wanted = set(shapes if targets == "all-linear" else targets)
        if self.experts and not self.shared_expert_intermediate and targets == "all-linear":
            wanted -= {"gate_proj", "up_proj", "down_proj"}
        return [shape for name, shape in shapes.items() if name in wanted]

    def most_adapted_modules(self, targets: Iterable[str] | str) -> int:
        """How many modules the layer that adapts the most wraps (a hybrid model's linear-attention
        layers adapt other modules than its full-attention ones)."""
        return max(len(self.adapted_modules(targets, linear)) for _, linear in self.layer_kinds())

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

        Every layer keeps them (a hybrid model's full and linear layers adapt different modules);
        with checkpointing only the layer being recomputed does, the larger kind's.
        """
        kept = []
        for count, linear in self.layer_kinds():
            per_layer = 0
            for features, _ in self.adapted_modules(targets, linear):
                copy = features * 4 if dtype_bytes != 4 or dropout else 0
                per_layer += copy + rank * 4 + (features if dropout else 0)
            kept.append((count, per_layer))
        if checkpointing:
            return tokens * max(per_layer for _, per_layer in kept)
        return tokens * sum(count * per_layer for count, per_layer in kept)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV cache bytes one token takes across the full-attention layers (all of them but a hybrid
        model's linear ones, which keep :meth:`state_bytes_per_sequence` instead), sliding-window
        layers included as if they kept every token (:meth:`kv_bytes` caps them at their window)."""
        return self.kv_bytes(1, dtype_bytes)

    def kv_bytes(self, tokens: int, dtype_bytes: int) -> int:
        """The KV cache of one sequence of ``tokens`` tokens: a sliding-window layer holds its window
        at most; a global layer every token, in its own heads where the config gives them apart."""
        sliding = self.sliding_layers * 2 * self.kv_heads * self.head_dim * min(tokens, self.sliding_window)
        width = (self.global_kv_heads or self.kv_heads) * (self.global_head_dim or self.head_dim)
        return (sliding + (self.full_layers - self.sliding_layers) * 2 * width * tokens) * dtype_bytes

    def state_bytes_per_sequence(self, dtype_bytes: int) -> int:
        """The conv and recurrent states one sequence keeps across a hybrid model's linear-attention
        layers, whatever its length (0 for a model without them)."""
        return self.linear_layers * self.linear.state_bytes(dtype_bytes) if self.linear is not None else 0

    def activation_bytes(self, tokens: int, dtype_bytes: int, checkpointing: bool) -> int:
        """Activations kept for the backward pass of one micro-batch of ``tokens`` tokens.

        Per token and layer a layer keeps its input and norms (~4 hidden) and the MLP's gate, up,
        activation and product (4 x intermediate, times the experts each token visits, plus a shared
        expert's); a full-attention layer q and the attention output (2 x heads x head_dim; gated
        attention twice that, for the gate and the gated output) and k and v; a linear-attention layer
        what its token mixer keeps instead (:meth:`LinearAttention.activation_bytes_per_token`). With
        checkpointing only each layer's input stays, plus one layer's worth (the larger kind's) while
        it is recomputed.
        """
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        mlp = 4 * self.intermediate * max(self.experts_per_token, 1) + 4 * self.shared_expert_intermediate
        common = (4 * self.hidden + mlp) * dtype_bytes
        attention = (2 * q * (2 if self.gated_attention else 1) + 2 * kv) * dtype_bytes
        mixer = self.linear.activation_bytes_per_token(dtype_bytes) if self.linear is not None else 0
        layers = [(count, common + (mixer if linear else attention)) for count, linear in self.layer_kinds()]
        largest = max(per_layer for _, per_layer in layers)
        # One more layer's worth: the gradients flowing back through the layer being differentiated.
        if checkpointing:
            kept = self.layers * self.hidden * dtype_bytes + 2 * largest
        else:
            kept = sum(count * per_layer for count, per_layer in layers) + largest
        return tokens * kept

    def logits_bytes(self, positions: int, dtype_bytes: int) -> int:
        """The output head's working set for ``positions`` positions: logits in the model's dtype,
        their float32 copy, the softmax of the entropy and the float32 gradient."""
        return positions * self.vocab * (dtype_bytes + 3 * 4)
