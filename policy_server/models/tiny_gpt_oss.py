"""A tiny gpt-oss, offline: ``GptOssForCausalLM`` at toy size with its architecture kept (mixture of
experts, grouped-query attention with sinks, alternating sliding and full attention, YaRN rotary
embeddings, head_dim 64), plain float32 weights (no MXFP4), random init; a byte-level BPE tokenizer
(``tiny.py``'s) holding harmony's special tokens; the ``harmony`` chat template; generation stops at
``<|return|>`` (an answer) and ``<|call|>`` (a tool call), as gpt-oss's does.

``rft model tiny DIR --family gpt_oss`` builds one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from policy_server.models.chat_templates import chat_template_text
from policy_server.models.families.base import TinySizes
from policy_server.models.saving import plain_tokenizer_class, save_random_model
from policy_server.models.tiny import HEAD_DIM, _example_conversations, _train_tokenizer

START_OF_TEXT = "<|startoftext|>"
END_OF_TEXT = "<|endoftext|>"
RETURN = "<|return|>"
CALL = "<|call|>"
# harmony's special tokens, each one token as in o200k_harmony.
HARMONY_TOKENS = (
    START_OF_TEXT,
    END_OF_TEXT,
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    RETURN,
    CALL,
    "<|endofprompt|>",
)
TEMPLATE = chat_template_text("harmony")
# The real model's shape, scaled down: 4 experts (it has 32 or 128), 2 routed per token (it routes 4);
# 2 query heads per key/value head (it has 8); a 128-token sliding window on every other layer.
EXPERTS = 4
EXPERTS_PER_TOKEN = 2
QUERIES_PER_KV_HEAD = 2
SLIDING_WINDOW = 128
# gpt-oss stretches 4,096 trained positions 32 times with YaRN; the tiny one keeps the factor.
YARN_FACTOR = 32.0


def _with_reasoning(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation with a line of reasoning on each assistant turn (the analysis channel)."""
    return [
        {**message, "reasoning_content": "The user wants an answer; check what the tools return."}
        if message["role"] == "assistant"
        else message
        for message in messages
    ]


def _corpus_texts(extra: Sequence[str]) -> list[str]:
    from transformers.utils.chat_template_utils import render_jinja_template

    texts: list[str] = []
    for messages, tools in _example_conversations():
        for conversation in (messages, _with_reasoning(messages[:-1])):
            rendered, _ = render_jinja_template(
                conversations=[conversation],
                tools=tools or None,
                chat_template=TEMPLATE,
                add_generation_prompt=True,
            )
            texts.extend(rendered)
    # What the model itself writes: the recipient after the channel, answers ending <|return|>.
    texts.append('<|channel|>commentary to=functions.move <|constrain|>json<|message|>{"direction": "up"}')
    texts.append("<|channel|>final<|message|>Thank you! The task is complete.<|return|>")
    texts.extend(extra)
    return texts


def _save_tokenizer(tokenizer_object: Any, out: Path, max_length: int) -> Any:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer_object,
        bos_token=START_OF_TEXT,
        eos_token=RETURN,
        pad_token=END_OF_TEXT,
        model_max_length=max_length,
        chat_template=TEMPLATE,
    )
    tokenizer.save_pretrained(out)
    plain_tokenizer_class(out)
    return tokenizer


def build_tiny_gpt_oss(
    out_dir: str | Path, *, seed: int = 0, corpus: Sequence[str] = (), sizes: TinySizes = TinySizes()
) -> Path:
    """Build the tokenizer, template and a randomly initialised tiny gpt-oss into ``out_dir``."""
    from transformers import GptOssConfig, GptOssForCausalLM

    heads = max(QUERIES_PER_KV_HEAD, sizes.hidden_size // HEAD_DIM)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _save_tokenizer(
        _train_tokenizer(_corpus_texts(corpus), sizes.vocab_size, HARMONY_TOKENS),
        out,
        sizes.max_position_embeddings,
    )
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in HARMONY_TOKENS}
    config = GptOssConfig(
        vocab_size=len(tokenizer),
        hidden_size=sizes.hidden_size,
        intermediate_size=sizes.intermediate_size,
        num_hidden_layers=sizes.num_layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // QUERIES_PER_KV_HEAD,
        head_dim=HEAD_DIM,
        num_local_experts=EXPERTS,
        num_experts_per_tok=EXPERTS_PER_TOKEN,
        sliding_window=SLIDING_WINDOW,
        max_position_embeddings=sizes.max_position_embeddings,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": YARN_FACTOR,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": max(1, int(sizes.max_position_embeddings / YARN_FACTOR)),
        },
        bos_token_id=ids[START_OF_TEXT],
        eos_token_id=ids[RETURN],
        pad_token_id=ids[END_OF_TEXT],
        tie_word_embeddings=False,
        dtype="float32",
    )
    return save_random_model(
        GptOssForCausalLM,
        config,
        out,
        seed=seed,
        eos_token_ids=[ids[RETURN], ids[CALL]],
        pad_token_id=ids[END_OF_TEXT],
        bos_token_id=ids[START_OF_TEXT],
    )
