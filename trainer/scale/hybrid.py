"""The linear-attention layers of hybrid models (Qwen 3.5 / 3.6: ``model_type`` qwen3_5, qwen3_5_text,
qwen3_5_moe, qwen3_5_moe_text), sized from config.json for :class:`trainer.scale.memory.ModelShape`.

Of every four language-model layers three are Gated DeltaNet linear attention (``config.layer_types``
"linear_attention"; transformers' ``Qwen3_5GatedDeltaNet``) and one gated full attention. A linear
layer has no q/k/v/o and no KV cache: it projects the hidden state to queries, keys and values for a
depthwise causal conv1d, to a gate ``z`` and to per-head ``a``/``b``, runs the gated delta rule and
projects back; a sequence carries a conv state and a recurrent state through it instead of a KV cache
that grows per token. Kept apart from ``memory`` so that module stays about the layers every family has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The nn.Linear modules of a linear-attention layer (what peft's "all-linear" wraps there; the conv1d
# is an nn.Conv1d, which it leaves alone).
LINEAR_ATTENTION_MODULES = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
# The recurrent state's bytes per element: transformers runs the delta rule in float32 and caches its
# state so (and the published configs ask vLLM for the same, ``mamba_ssm_dtype: float32``).
RECURRENT_STATE_BYTES = 4
# The chunk length of transformers' chunked delta rule (its intra-chunk matrices are per head and row).
DELTA_RULE_CHUNK = 64


@dataclass(frozen=True)
class LinearAttention:
    """The sizes of one Gated DeltaNet layer (every linear layer of a model has the same)."""

    key_heads: int
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int

    @classmethod
    def from_config(cls, read: Callable[[str], int]) -> LinearAttention:
        """The sizes from a config's ``linear_*`` keys, each read by ``read`` (which refuses a config
        that lacks one)."""
        return cls(
            key_heads=read("linear_num_key_heads"),
            value_heads=read("linear_num_value_heads"),
            key_head_dim=read("linear_key_head_dim"),
            value_head_dim=read("linear_value_head_dim"),
            conv_kernel=read("linear_conv_kernel_dim"),
        )

    @property
    def key_dim(self) -> int:
        return self.key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """The conv1d's channels: queries, keys and values side by side."""
        return 2 * self.key_dim + self.value_dim

    def linear_shapes(self, hidden: int) -> dict[str, tuple[int, int]]:
        """(in, out) features of the layer's nn.Linear modules."""
        return {
            "in_proj_qkv": (hidden, self.conv_dim),
            "in_proj_z": (hidden, self.value_dim),
            "in_proj_b": (hidden, self.value_heads),
            "in_proj_a": (hidden, self.value_heads),
            "out_proj": (self.value_dim, hidden),
        }

    def parameters(self, hidden: int) -> int:
        """The layer's token mixer: its projections, the depthwise conv1d (one kernel a channel, no
        bias), ``dt_bias`` and ``A_log`` (one a value head) and the gated RMSNorm's head_v_dim weights."""
        projections = sum(i * o for i, o in self.linear_shapes(hidden).values())
        return projections + self.conv_dim * self.conv_kernel + 2 * self.value_heads + self.value_head_dim

    def state_bytes(self, dtype_bytes: int) -> int:
        """What one sequence carries through the layer instead of a KV cache, whatever its length: the
        conv state (conv_dim x kernel, in the model's dtype, as transformers' cache keeps it) and the
        recurrent state (value heads x head_k_dim x head_v_dim, float32)."""
        conv = self.conv_dim * self.conv_kernel * dtype_bytes
        recurrent = self.value_heads * self.key_head_dim * self.value_head_dim * RECURRENT_STATE_BYTES
        return conv + recurrent

    def activation_bytes_per_token(self, dtype_bytes: int) -> int:
        """What the token mixer keeps for the backward pass per token, beside the layer's input and norms
        (which :meth:`ModelShape.activation_bytes` counts for every layer). Fitted to the tensors
        autograd saves (saved_tensors_hooks; the weights frozen, as under LoRA, and left out) for one
        layer of transformers' reference PyTorch path, what runs without the flash-linear-attention
        kernels (which recompute and keep less): bf16, the sizes varied one at a time, then checked at
        Qwen 3.6 27B's sizes (509,796 bytes a token measured, 509,632 by this formula), a 2048-wide
        one (345,362; 345,216) and the tiny model's (21,600; 21,576). Why not the full-attention
        formula: the reference delta rule keeps float32 copies per value head and chunk, several
        times what q, k and v take.

        - in the model's dtype: in_proj_qkv's output and the conv's (2 x conv_dim), the gate ``z``,
          the delta rule's output cast back and the gated norm's output (3 x value_dim);
        - in float32: the delta rule's queries and keys repeated to the value heads, with their
          normalised and beta-scaled copies (8 x value_heads x head_k_dim), its values and their
          copies (5 x value_dim), each chunk's decay and attention rows (~5 x 64 + 9 per value head)
          and the recurrent state before each chunk of 64 tokens (value heads x head_k x head_v / 64).
        """
        heads = self.value_heads
        model_dtype = 2 * self.conv_dim + 3 * self.value_dim
        float32 = 5 * self.value_dim + 8 * heads * self.key_head_dim + heads * (5 * DELTA_RULE_CHUNK + 9)
        states = heads * self.key_head_dim * self.value_head_dim * RECURRENT_STATE_BYTES // DELTA_RULE_CHUNK
        return model_dtype * dtype_bytes + float32 * 4 + states


def linear_layer_count(text: dict[str, Any], interval: int | None, layers: int) -> int:
    """How many of the ``layers`` of a (text) config are linear attention: its ``layer_types``' count,
    or, for a hybrid family's config without them, all but every ``full_attention_interval``-th (the
    config's, else the family's ``interval``, as transformers fills them in); 0 for other models."""
    if text.get("layer_types"):
        return sum(1 for kind in text["layer_types"] if kind == "linear_attention")
    if interval is not None:
        return layers - layers // int(text.get("full_attention_interval") or interval)
    return 0
