"""The qwen3 family: its tiny model, its chat format (the ``qwen3`` template) and its parsing, which
must return the fields vLLM's own ``qwen3`` reasoning and ``hermes`` tool-call parsers return."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from policy_server.models.families import family, family_of
from policy_server.models.families.qwen3 import FAMILY as QWEN3
from tests.vllm_parsers import VLLMParsers

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SECOND = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
QWEN3_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
# Completions as a Qwen3 writes them: reasoning, tool calls, both, neither, and the odd ones.
COMPLETIONS = (
    "<think>\nThe user wants the weather.\n</think>\n\nIt is sunny in Paris.",
    f"<think>\nI need the tool.\n</think>\n\n{CALL}",
    f"<think>\nTwo cities.\n</think>\n\nLooking both up.\n{CALL}\n{SECOND}",
    f"I will look it up.\n{CALL}",
    "It is sunny in Paris.",
    "<think>\n\n</think>\n\nSunny.",
    "<think>\nStill thinking when the tokens ran out",
    "<think>\nBroken call.\n</think>\n\n" + CALL.replace('{"city": "Paris"}', "{oops"),
)


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return family("qwen3").build_tiny(tmp_path_factory.mktemp("tiny-qwen3") / "model")


def test_the_tiny_qwen3_is_a_qwen3_with_qwens_special_tokens(qwen3_dir: Path) -> None:
    config = AutoConfig.from_pretrained(qwen3_dir)
    assert config.model_type == "qwen3" and config.head_dim == 64 and config.num_hidden_layers == 2
    assert family_of(qwen3_dir) is QWEN3
    tokenizer = AutoTokenizer.from_pretrained(qwen3_dir)
    for token in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", *QWEN3_TAGS):
        assert len(tokenizer(token, add_special_tokens=False)["input_ids"]) == 1, token
    ids = tokenizer(f"<think>\nx\n</think>\n\n{CALL}", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == f"<think>\nx\n</think>\n\n{CALL}"
    model = AutoModelForCausalLM.from_pretrained(qwen3_dir)
    assert type(model).__name__ == "Qwen3ForCausalLM"


def _episode() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "reasoning_content": "I need the tool.", "tool_calls": [_call("Paris")]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "<think>\nIt is sunny.\n</think>\n\nSunny."},
    ]


def _call(city: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}


def test_the_template_renders_qwen3s_format(qwen3_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen3_dir)
    text = tokenizer.apply_chat_template(_episode(), tools=[WEATHER], tokenize=False)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions")
    assert "<tools>\n" + json.dumps(WEATHER) + "\n</tools>" in text
    # Reasoning after the last user query is kept, in front of the calls and the answer.
    assert f"<|im_start|>assistant\n<think>\nI need the tool.\n</think>\n\n{CALL}<|im_end|>\n" in text
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n<think>\nIt is sunny.\n</think>\n\nSunny.<|im_end|>\n")


def test_earlier_turns_lose_their_reasoning_after_a_new_user_query(qwen3_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen3_dir)
    messages = [*_episode(), {"role": "user", "content": "Thanks"}]
    text = tokenizer.apply_chat_template(
        messages, tools=[WEATHER], tokenize=False, add_generation_prompt=True
    )
    assert "<think>" not in text
    assert f"<|im_start|>assistant\n{CALL}<|im_end|>\n" in text and "assistant\nSunny.<|im_end|>" in text
    assert text.endswith("<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n")


def test_enable_thinking_false_closes_an_empty_think_block_in_the_generation_prompt(qwen3_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen3_dir)
    messages = [{"role": "user", "content": "Hi"}]
    off = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    on = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert off == on + "<think>\n\n</think>\n\n"
    assert on == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_a_sampled_turn_renders_back_to_its_own_tokens(qwen3_dir: Path) -> None:
    """Within one user query a multi-turn tool episode merges: the next prompt extends the last."""
    tokenizer = AutoTokenizer.from_pretrained(qwen3_dir)
    messages = _episode()[:2]
    prompt = tokenizer.apply_chat_template(
        messages, tools=[WEATHER], add_generation_prompt=True, return_dict=False
    )
    sampled = tokenizer(f"<think>\nI need the tool.\n</think>\n\n{CALL}<|im_end|>", add_special_tokens=False)
    parsed = QWEN3.parse_text(f"<think>\nI need the tool.\n</think>\n\n{CALL}", tools=True)
    reply = {"role": "assistant", "content": parsed.content, "reasoning_content": parsed.reasoning_content}
    reply["tool_calls"] = [{**call, "function": {**call["function"]}} for call in parsed.tool_calls]
    following = [*messages, reply, {"role": "tool", "content": "sunny"}]
    after = tokenizer.apply_chat_template(
        following, tools=[WEATHER], add_generation_prompt=True, return_dict=False
    )
    assert after[: len(prompt) + len(sampled["input_ids"])] == prompt + sampled["input_ids"]


def test_the_parse_splits_reasoning_content_and_calls() -> None:
    both = QWEN3.parse_text(COMPLETIONS[2], tools=True)
    assert both.reasoning_content == "\nTwo cities.\n"
    assert both.content == "\n\nLooking both up.\n"
    assert [json.loads(call["function"]["arguments"]) for call in both.tool_calls] == [
        {"city": "Paris"},
        {"city": "Oslo"},
    ]
    untold = QWEN3.parse_text(COMPLETIONS[1], tools=False)
    assert untold.tool_calls == [] and untold.content == f"\n\n{CALL}"
    off = QWEN3.parsing_for({"enable_thinking": False}).parse_text(COMPLETIONS[4], tools=True)
    assert (off.reasoning_content, off.content) == (None, "It is sunny in Paris.")
    assert QWEN3.parsing_for({}) is QWEN3


def _cases(tokenizer: Any) -> list[dict[str, Any]]:
    cases = []
    for text in COMPLETIONS:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for tools in ([WEATHER], None):
            for thinking in (True, False):
                cases.append({"text": text, "ids": ids, "tools": tools, "enable_thinking": thinking})
    return cases


@pytest.mark.vllm
def test_the_parse_returns_what_vllms_qwen3_and_hermes_parsers_return(
    qwen3_dir: Path, vllm_parsers: VLLMParsers
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen3_dir)
    cases = _cases(tokenizer)
    job = {
        "model_dir": str(qwen3_dir),
        "tool_parser": "hermes",
        "reasoning_parser": "qwen3",
        "cases": [{k: v for k, v in c.items() if k != "text"} for c in cases],
    }
    for case, theirs in zip(cases, vllm_parsers(job), strict=True):
        family_parse = QWEN3.parsing_for({"enable_thinking": case["enable_thinking"]})
        ours = family_parse.parse(tokenizer, case["ids"], tools=case["tools"] is not None)
        mine = {
            "reasoning": ours.reasoning_content,
            "content": ours.content,
            "tool_calls": [
                [call["function"]["name"], call["function"]["arguments"]] for call in ours.tool_calls
            ],
        }
        assert mine == theirs, (case["text"], case["tools"] is not None, case["enable_thinking"])
