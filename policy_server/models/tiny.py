"""Tiny offline models: a byte-level BPE tokenizer with a tool-aware ChatML template and a small Llama.

Tests and the CPU demo use these instead of downloading weights. The result loads with transformers
(``AutoModelForCausalLM`` / ``AutoTokenizer``) and with vLLM (head_dim 64, plain Llama config,
``tokenizer_class: PreTrainedTokenizerFast``).

``rft model tiny OUT [--seed N] [--corpus FILE ...]`` builds one from the command line
(``policy_server/models/model_cli.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from policy_server.models.chat_templates import chat_template_text
from policy_server.models.saving import plain_tokenizer_class, save_random_model

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE_START = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"
CONTROL_TOKENS = (IM_START, IM_END, END_OF_TEXT)
# Not "special": decoding with skip_special_tokens=True must keep them, or tool calls vanish from text.
TOOL_TAGS = (TOOL_CALL_START, TOOL_CALL_END, TOOL_RESPONSE_START, TOOL_RESPONSE_END)

HEAD_DIM = 64

# ChatML in the hermes/Qwen style, shipped as the `chatml-tools` template (policy_server/models/chat_templates
# says why and how it is prefix-preserving).
CHAT_TEMPLATE = chat_template_text("chatml-tools")


def _function(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(properties)},
        },
    }


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


_WEATHER = _function("get_weather", "Current weather for a city.", {"city": {"type": "string"}})
_GUESS = _function("guess_word", "Guess the secret five-letter word.", {"word": {"type": "string"}})
_MOVE = _function(
    "move",
    "Move one step in the maze.",
    {"direction": {"type": "string", "enum": ["up", "down", "left", "right"]}},
)
_ADD = _function("add", "Add two numbers.", {"a": {"type": "number"}, "b": {"type": "number"}})

_CITIES = ("Paris", "Berlin", "Tokyo", "Lima", "Cairo", "Oslo", "Seattle", "Madrid")
_WORDS = ("crane", "slate", "pious", "lemon", "night", "brave", "cloud", "sound")
_DIRECTIONS = ("up", "down", "left", "right")
_PROSE = (
    "You are a helpful assistant. Answer briefly and use the tools when they help.",
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun.",
    "Please find the shortest path from the start to the goal without walking into walls.",
    "The weather today is sunny with a light wind from the west and a high of twenty degrees.",
    "Guess the word in six tries. Each guess must be a valid five-letter English word.",
    "Green means the letter is in the right place, yellow means it is in the word elsewhere.",
    "I will check that for you now. Here is what I found, and the answer is below.",
    "Thank you! The task is complete. Let me know if there is anything else I can do.",
    "Reasoning step by step: first read the question, then decide which function to call and why.",
    "The result of the calculation is forty-two, which matches the expected value exactly.",
    "Sorry, that word is not in the dictionary. Try another guess with different letters.",
    "A wall blocks the way to the north, so turning east or south is the only option left.",
    "Reward: 1.0 when the goal is reached within the move limit, otherwise 0.0 for the episode.",
    "Numbers like 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 100 and 3.14 appear in arguments and results.",
    "Error: the tool returned an invalid response. Check the arguments and call it again.",
    "Summary of the conversation so far, including every observation the environment returned.",
)


def _example_conversations() -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """(messages, tools) pairs covering every template feature: system, tools, calls, results."""
    return [
        *_weather_conversations(),
        *_word_conversations(),
        *_maze_conversations(),
        *_arithmetic_conversations(),
        ([{"role": "user", "content": text} for text in _PROSE[1:]], []),
    ]


Conversation = tuple[list[dict[str, Any]], list[dict[str, Any]]]


def _weather_conversations() -> list[Conversation]:
    """A system prompt, list-part user content, one tool call, its JSON result, an answer."""
    conversations: list[Conversation] = []
    for index, city in enumerate(_CITIES):
        degrees = 10 + 3 * index
        conversations.append(
            (
                [
                    {"role": "system", "content": _PROSE[0]},
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": f"What is the weather in {city}?"}],
                    },
                    {"role": "assistant", "tool_calls": [_call("get_weather", {"city": city})]},
                    {
                        "role": "tool",
                        "content": json.dumps({"city": city, "celsius": degrees, "sky": "clear"}),
                    },
                    {"role": "assistant", "content": f"It is {degrees} degrees and clear in {city}."},
                ],
                [_WEATHER],
            )
        )
    return conversations


def _word_conversations() -> list[Conversation]:
    """Content beside a tool call, coloured results, a second call."""
    conversations: list[Conversation] = []
    for index, word in enumerate(_WORDS):
        conversations.append(
            (
                [
                    {"role": "user", "content": _PROSE[4] + " " + _PROSE[5]},
                    {
                        "role": "assistant",
                        "content": "I will start.",
                        "tool_calls": [_call("guess_word", {"word": word})],
                    },
                    {
                        "role": "tool",
                        "content": f"{word}: "
                        + " ".join(("green", "yellow", "gray")[(index + i) % 3] for i in range(5)),
                    },
                    {
                        "role": "assistant",
                        "tool_calls": [_call("guess_word", {"word": _WORDS[(index + 1) % len(_WORDS)]})],
                    },
                ],
                [_GUESS],
            )
        )
    return conversations


def _maze_conversations() -> list[Conversation]:
    """Several tool-calling turns in a row, then an answer."""
    conversations: list[Conversation] = []
    for index in range(8):
        path = [_DIRECTIONS[(index + step) % 4] for step in range(3)]
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": _PROSE[2] + f" Maze {index}: ##.#\n#S.#\n#.G#"}
        ]
        for direction in path:
            messages.append({"role": "assistant", "tool_calls": [_call("move", {"direction": direction})]})
            messages.append(
                {"role": "tool", "content": f"You moved {direction}. Position ({index}, {len(messages)})."}
            )
        messages.append({"role": "assistant", "content": _PROSE[7]})
        conversations.append((messages, [_MOVE]))
    return conversations


def _arithmetic_conversations() -> list[Conversation]:
    """Two parallel tool calls and two results in a row."""
    conversations: list[Conversation] = []
    for a in range(1, 9):
        conversations.append(
            (
                [
                    {"role": "user", "content": f"What is {a * 7} plus {a * 13}?"},
                    {
                        "role": "assistant",
                        "tool_calls": [
                            _call("add", {"a": a * 7, "b": a * 13}),
                            _call("add", {"a": a, "b": 1}),
                        ],
                    },
                    {"role": "tool", "content": str(a * 20)},
                    {"role": "tool", "content": str(a + 1)},
                    {"role": "assistant", "content": f"{_PROSE[6]} {a * 7} + {a * 13} = {a * 20}."},
                ],
                [_ADD, _WEATHER],
            )
        )
    return conversations


def _corpus_texts(extra: Iterable[str] | None, chat_template: str = CHAT_TEMPLATE) -> list[str]:
    """The example conversations rendered with ``chat_template``, the prose, and ``extra``."""
    from transformers.utils.chat_template_utils import render_jinja_template

    texts: list[str] = []
    for messages, tools in _example_conversations():
        rendered, _ = render_jinja_template(
            conversations=[messages], tools=tools or None, chat_template=chat_template
        )
        texts.extend(rendered)
    texts.extend(_PROSE)
    if extra is not None:
        texts.extend(extra)
    return texts


def _train_tokenizer(
    texts: Sequence[str], vocab_size: int, special_tokens: Sequence[str] = (*CONTROL_TOKENS, *TOOL_TAGS)
) -> Any:
    """A byte-level BPE over ``texts`` whose ``special_tokens`` (a family's markers) are single tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    # Newlines are always their own pre-token: a turn boundary ("...\n" + next text) then tokenizes
    # the same whether rendered in one piece or as prompt + completion.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex("\n"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def _save_tokenizer(
    tokenizer_object: Any,
    out_dir: Path,
    max_length: int,
    *,
    chat_template: str = CHAT_TEMPLATE,
    extra_special_tokens: Sequence[str] = (),
) -> Any:
    """Save the tokenizer with ``chat_template``; ``extra_special_tokens`` join ``<|im_start|>``."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer_object,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        model_max_length=max_length,
        chat_template=chat_template,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, *extra_special_tokens]})
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TOOL_TAGS])
    tokenizer.save_pretrained(out_dir)
    plain_tokenizer_class(out_dir)
    return tokenizer


def build_tiny_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    corpus: Iterable[str] | None = None,
    vocab_size: int = 1024,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    intermediate_size: int = 256,
    max_position_embeddings: int = 2048,
) -> Path:
    """Build a tokenizer, chat template and randomly initialised Llama into ``out_dir``; return it.

    ``corpus``: extra texts the BPE trains on (besides built-in chat-rendered tool conversations), so
    a task's own tool calls tokenize compactly. ``vocab_size`` is the BPE's target; a small corpus
    may yield fewer tokens, and the model's vocabulary is the tokenizer's actual size.
    ``num_heads`` must equal ``hidden_size / 64`` (head_dim 64, which vLLM's attention needs).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    if hidden_size != num_heads * HEAD_DIM:
        raise ValueError(
            f"hidden_size ({hidden_size}) must be num_heads ({num_heads}) x {HEAD_DIM}: "
            f"vLLM needs head_dim {HEAD_DIM}; pass num_heads={max(1, hidden_size // HEAD_DIM)}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _save_tokenizer(
        _train_tokenizer(_corpus_texts(corpus), vocab_size), out, max_position_embeddings
    )
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    end_of_text = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=HEAD_DIM,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=None,
        eos_token_id=im_end,
        pad_token_id=end_of_text,
        tie_word_embeddings=False,
        dtype="float32",
    )
    return save_random_model(
        LlamaForCausalLM,
        config,
        out,
        seed=seed,
        eos_token_ids=[im_end, end_of_text],
        pad_token_id=end_of_text,
    )


def read_corpus(paths: list[Path]) -> list[str]:
    """The non-empty lines of ``paths``, for the tokenizer's corpus; an unreadable file is a ValueError."""
    texts: list[str] = []
    for path in paths:
        try:
            texts.extend(line for line in path.read_text().splitlines() if line.strip())
        except OSError as exc:
            raise ValueError(f"cannot read corpus file {path}: {exc.strerror}") from exc
    return texts
