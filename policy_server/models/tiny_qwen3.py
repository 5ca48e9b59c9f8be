"""A tiny offline Qwen3 (the dense architecture of the Qwen3 line), random init, for tests.

``rft model tiny DIR --family qwen3`` writes a directory that transformers, peft and vLLM load: a
``Qwen3ForCausalLM`` (q/k norms, grouped-query attention) at the tiny model's size with head_dim 64
(vLLM's), and the tiny model's byte-level BPE trained on conversations in Qwen3's format (the
``qwen3`` template, which the directory carries), with Qwen3's special tokens: ``<|im_start|>``,
``<|im_end|>``, ``<|endoftext|>`` special; ``<tool_call>``, ``</tool_call>``, ``<tool_response>``,
``</tool_response>``, ``<think>``, ``</think>`` added but not special, so decoding keeps them as
Qwen3's tokenizer does.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from policy_server.models.chat_templates import chat_template_text
from policy_server.models.saving import plain_tokenizer_class, save_random_model
from policy_server.models.tiny import (
    _PROSE,
    END_OF_TEXT,
    HEAD_DIM,
    IM_END,
    _example_conversations,
    _save_tokenizer,
    _train_tokenizer,
)

CHAT_TEMPLATE = chat_template_text("qwen3")
THINK_TAGS = ("<think>", "</think>")
ROPE_THETA = 1_000_000.0  # Qwen3's


def _thinking_conversations() -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """Reasoning before answers and tool calls, so the BPE sees Qwen3's think blocks."""
    weather = _example_conversations()[0]
    thought = "The user asks about the weather, so I call the tool."
    messages = [
        {**message, "reasoning_content": thought} if message["role"] == "assistant" else message
        for message in weather[0]
    ]
    return [(messages, weather[1]), ([{"role": "user", "content": _PROSE[8]}], [])]


def _corpus_texts(extra: Iterable[str] | None, chat_template: str) -> list[str]:
    """The tiny model's conversations (with and without thinking) rendered by ``chat_template``, its
    prose and ``extra``."""
    from transformers.utils.chat_template_utils import render_jinja_template

    texts: list[str] = []
    for messages, tools in [*_example_conversations(), *_thinking_conversations()]:
        rendered, _ = render_jinja_template(
            conversations=[messages], tools=tools or None, chat_template=chat_template
        )
        texts.extend(rendered)
    texts.extend(_PROSE)
    texts.extend(extra or ())
    return texts


def save_thinking_tokenizer(
    out: Path, corpus: Iterable[str] | None, vocab_size: int, max_length: int, chat_template: str
) -> Any:
    """The tiny BPE of a Qwen-format family (Qwen3's, Qwen 3.5's), trained on its conversations as
    ``chat_template`` renders them, saved to ``out`` with the template."""
    from tokenizers import AddedToken

    tokenizer = _save_tokenizer(
        _train_tokenizer(_corpus_texts(corpus, chat_template), vocab_size),
        out,
        max_length,
        chat_template=chat_template,
    )
    # Qwen's <think> tags are added tokens but not special ones: decoding keeps them as text.
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in THINK_TAGS])
    tokenizer.save_pretrained(out)
    plain_tokenizer_class(out)
    return tokenizer


def build_tiny_qwen3(
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
    """Build the tokenizer and a randomly initialised Qwen3 into ``out_dir``; return it.

    ``corpus`` and ``vocab_size`` are the tiny model's (``build_tiny_model``); ``hidden_size`` must be
    a multiple of 64 (head_dim 64, vLLM's). Two query heads share each key/value head, as in Qwen3's
    grouped-query attention, when there are two or more.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if hidden_size % HEAD_DIM:
        raise ValueError(f"hidden_size ({hidden_size}) must be a multiple of {HEAD_DIM} (vLLM's head_dim)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = save_thinking_tokenizer(out, corpus, vocab_size, max_position_embeddings, CHAT_TEMPLATE)
    im_end, end_of_text = (
        tokenizer.convert_tokens_to_ids(IM_END),
        tokenizer.convert_tokens_to_ids(END_OF_TEXT),
    )
    heads = hidden_size // HEAD_DIM
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=HEAD_DIM,
        max_position_embeddings=max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        bos_token_id=None,
        eos_token_id=im_end,
        pad_token_id=end_of_text,
        tie_word_embeddings=False,
        dtype="float32",
    )
    return save_random_model(
        Qwen3ForCausalLM,
        config,
        out,
        seed=seed,
        eos_token_ids=[im_end, end_of_text],
        pad_token_id=end_of_text,
    )
