"""A tiny Gemma 4 built offline: the 31B's text architecture at toy size (sliding-window layers with a
last global layer, global layers with twice the head size, one KV head and keys reused as values,
logit soft-capping, tied embeddings), random init; tiny.py's byte-level BPE holding Gemma 4's control
tokens, and the ``gemma4`` template."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from policy_server.models.chat_templates import chat_template_text
from policy_server.models.families.base import TinySizes
from policy_server.models.saving import plain_tokenizer_class, save_random_model

# Gemma 4's control tokens, all special in its tokenizer; the first four take ids 0-3 as in Gemma's.
SPECIAL_TOKENS = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<|turn>",
    "<turn|>",
    "<|think|>",
    "<|channel>",
    "<channel|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
)
# A model turn ends at <turn|>, or at <|tool_response> after a call (the tool's result follows).
STOP_TOKENS = ("<turn|>", "<|tool_response>", "<eos>")

HEAD_DIM = 64  # vLLM's CPU attention takes it; the global layers' is twice that, as in Gemma 4
# Small enough that the suite's prompts reach past it, so the sliding layers are exercised.
SLIDING_WINDOW = 64


def build_tiny_gemma4(
    out_dir: str | Path, *, seed: int = 0, corpus: Sequence[str] = (), sizes: TinySizes = TinySizes()
) -> Path:
    """Write the tokenizer, the ``gemma4`` template and a random Gemma4ForCausalLM to ``out_dir``."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    if sizes.hidden_size % HEAD_DIM:
        raise ValueError(
            f"hidden_size ({sizes.hidden_size}) must be a multiple of {HEAD_DIM} (the head size)"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _save_tokenizer(out, corpus, sizes)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    stops = [ids[token] for token in STOP_TOKENS]
    config = Gemma4TextConfig(
        vocab_size=len(tokenizer),
        vocab_size_per_layer_input=len(tokenizer),
        hidden_size_per_layer_input=0,
        hidden_size=sizes.hidden_size,
        intermediate_size=sizes.intermediate_size,
        num_hidden_layers=max(2, sizes.num_layers),
        num_attention_heads=sizes.hidden_size // HEAD_DIM,
        num_key_value_heads=1,
        head_dim=HEAD_DIM,
        global_head_dim=2 * HEAD_DIM,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        layer_types=["sliding_attention"] * (max(2, sizes.num_layers) - 1) + ["full_attention"],
        sliding_window=SLIDING_WINDOW,
        final_logit_softcapping=30.0,
        # At transformers' 0.02 the tied head's logits span a few units and LoRA, which cannot reach
        # the embeddings, barely moves the loss; 0.1 lets a few steps teach the tiny model a format.
        initializer_range=0.1,
        max_position_embeddings=sizes.max_position_embeddings,
        pad_token_id=ids["<pad>"],
        bos_token_id=ids["<bos>"],
        eos_token_id=stops,
        tie_word_embeddings=True,
        dtype="float32",
    )
    return save_random_model(
        Gemma4ForCausalLM,
        config,
        out,
        seed=seed,
        eos_token_ids=stops,
        pad_token_id=ids["<pad>"],
        bos_token_id=ids["<bos>"],
    )


def _save_tokenizer(out: Path, corpus: Sequence[str], sizes: TinySizes) -> Any:
    from transformers import PreTrainedTokenizerFast

    from policy_server.models.tiny import _corpus_texts, _train_tokenizer

    template = chat_template_text("gemma4")
    texts = _corpus_texts(list(corpus), chat_template=template)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(texts, sizes.vocab_size, special_tokens=SPECIAL_TOKENS),
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        model_max_length=sizes.max_position_embeddings,
        chat_template=template,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS[4:])})
    tokenizer.save_pretrained(out)
    plain_tokenizer_class(out)
    return tokenizer
