"""A tiny offline Qwen 3.5 (the hybrid architecture of Qwen 3.5 and 3.6), random init, for tests.

``rft model tiny DIR --family qwen3_5`` writes a directory that transformers and peft load: a
text-only ``Qwen3_5ForCausalLM`` (``model_type`` ``qwen3_5_text``) at the tiny model's size keeping
the architecture: of every four layers three are Gated DeltaNet linear attention (a causal conv1d and
a recurrent state per sequence) and the fourth gated full attention (rotary on a quarter of head_dim
64, two query heads sharing one key/value head, q/k norms); at two or three layers the last one is
full attention, so both kinds are always there. The linear layers' key and value heads are 128 wide
(vLLM's CPU kernel refuses 32).

Text-only, not ``Qwen3_5ForConditionalGeneration`` (``qwen3_5``): the engines and the learner load
a config without a ``vision_config`` through ``AutoModelForCausalLM``
(``policy_server/models/vision_inputs.py``'s ``load_model``, ``trainer/learner/base_load.py``), which
maps ``qwen3_5_text`` to this class; a ``qwen3_5`` config would take the vision-language path and
need an image processor and a vision tower the tiny model has no use for. The language model's
layers, and so the hf engine's cache and the learner's LoRA targets, are the same in both.

The tokenizer is the tiny model's byte-level BPE trained on conversations rendered in Qwen 3.5's
format (the ``qwen3_5`` template, which the directory carries), with Qwen's special tokens:
``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>`` special; ``<tool_call>``, ``</tool_call>``,
``<tool_response>``, ``</tool_response>``, ``<think>``, ``</think>`` added but not special, so
decoding keeps them as Qwen's tokenizer does.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from policy_server.models.chat_templates import chat_template_text
from policy_server.models.saving import save_random_model
from policy_server.models.tiny import END_OF_TEXT, HEAD_DIM, IM_END
from policy_server.models.tiny_qwen3 import save_thinking_tokenizer

CHAT_TEMPLATE = chat_template_text("qwen3_5")
LINEAR_HEAD_DIM = 128
FULL_ATTENTION_INTERVAL = 4  # Qwen 3.5's: one full attention layer in four
ROPE_PARAMETERS = {
    "rope_type": "default",
    "rope_theta": 10_000_000.0,
    "partial_rotary_factor": 0.25,
    # Qwen 3.5's interleaved M-RoPE, its sections resized to the 8 frequencies of head_dim 64
    # (text positions are the same on every axis, so only the shape matters).
    "mrope_section": [3, 3, 2],
    "mrope_interleaved": True,
}


def layer_types(num_layers: int) -> list[str]:
    """Qwen 3.5's pattern (every fourth layer full attention), the last layer full attention when the
    pattern would leave none."""
    types = [
        "full_attention" if (index + 1) % FULL_ATTENTION_INTERVAL == 0 else "linear_attention"
        for index in range(num_layers)
    ]
    if "full_attention" not in types:
        types[-1] = "full_attention"
    return types


def build_tiny_qwen3_5(
    out_dir: str | Path,
    *,
    seed: int = 0,
    corpus: Iterable[str] | None = None,
    vocab_size: int = 1024,
    hidden_size: int = 128,
    num_layers: int = 2,
    intermediate_size: int = 256,
    max_position_embeddings: int = 2048,
) -> Path:
    """Build the tokenizer and a randomly initialised Qwen 3.5 into ``out_dir``; return it.

    ``hidden_size`` must be a multiple of 64 (full attention head_dim 64); the linear layers get one
    key head per 128 of ``hidden_size`` and two value heads per key head, as Qwen 3.5's do.
    """
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    if hidden_size % HEAD_DIM:
        raise ValueError(f"hidden_size ({hidden_size}) must be a multiple of {HEAD_DIM} (the head_dim)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = save_thinking_tokenizer(out, corpus, vocab_size, max_position_embeddings, CHAT_TEMPLATE)
    im_end, end_of_text = (
        tokenizer.convert_tokens_to_ids(IM_END),
        tokenizer.convert_tokens_to_ids(END_OF_TEXT),
    )
    heads = hidden_size // HEAD_DIM
    key_heads = max(1, hidden_size // LINEAR_HEAD_DIM)
    config = Qwen3_5TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        layer_types=layer_types(num_layers),
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=HEAD_DIM,
        linear_num_key_heads=key_heads,
        linear_num_value_heads=2 * key_heads,
        linear_key_head_dim=LINEAR_HEAD_DIM,
        linear_value_head_dim=LINEAR_HEAD_DIM,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=dict(ROPE_PARAMETERS),
        bos_token_id=None,
        eos_token_id=im_end,
        pad_token_id=end_of_text,
        tie_word_embeddings=False,
        dtype="float32",
    )
    return save_random_model(
        Qwen3_5ForCausalLM,
        config,
        out,
        seed=seed,
        eos_token_ids=[im_end, end_of_text],
        pad_token_id=end_of_text,
    )
