"""The qwen3_5 family (Qwen 3.5 / 3.6): its tiny hybrid model, its chat format (the ``qwen3_5``
template) and its parsing, which must return the fields vLLM 0.32's ``qwen3_coder`` tool-call and
``qwen3`` reasoning parsers return."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from policy_server.models.families import family, family_of, parsing_family, resolve_parsers
from policy_server.models.families.qwen3_5 import FAMILY as QWEN3_5
from policy_server.models.tiny_qwen3_5 import layer_types
from tests.vllm_parsers import VLLMParsers


def _xml_call(name: str, **arguments: str) -> str:
    parameters = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in arguments.items())
    return f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>"


CALL = _xml_call("get_weather", city="Paris", days="3")
SECOND = _xml_call("get_weather", city="Oslo", options='{"units": "metric", "hourly": false}')
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "options": {"type": "object"},
            },
            "required": ["city"],
        },
    },
}
QWEN_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
# Completions after the generation prompt's "<think>\n": string, integer and object arguments, two
# calls, text before a call, an unclosed think block, no thinking, and broken calls.
COMPLETIONS = (
    f"I need the tool.\n</think>\n\n{CALL}",
    f"Two cities.\n</think>\n\nLooking both up.\n\n{CALL}\n{SECOND}",
    "The user wants the weather.\n</think>\n\nIt is sunny in Paris.",
    "Still thinking when the tokens ran out",
    f"Checking.\n{CALL}\ntext after the call",
    "</think>\n\n<tool_call>\n<function=get_weather\n<parameter=city>\nParis\n</parameter>\n</tool_call>",
    "</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
    f"</think>\n\n{CALL.replace('</parameter>', '', 1)}",
    "</think>\n\nLet me look: <function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>",
)


@pytest.fixture(scope="module")
def qwen3_5_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return family("qwen3_5").build_tiny(tmp_path_factory.mktemp("tiny-qwen3-5") / "model")


def test_the_tiny_qwen3_5_is_a_hybrid_text_model_with_qwens_special_tokens(qwen3_5_dir: Path) -> None:
    config = AutoConfig.from_pretrained(qwen3_5_dir)
    assert config.model_type == "qwen3_5_text"
    assert config.layer_types == ["linear_attention", "full_attention"]
    assert family_of(qwen3_5_dir) is QWEN3_5
    tokenizer = AutoTokenizer.from_pretrained(qwen3_5_dir)
    for token in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", *QWEN_TAGS):
        assert len(tokenizer(token, add_special_tokens=False)["input_ids"]) == 1, token
    assert (
        tokenizer.decode(tokenizer(CALL, add_special_tokens=False)["input_ids"], skip_special_tokens=True)
        == CALL
    )
    model = AutoModelForCausalLM.from_pretrained(qwen3_5_dir)
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    linear, full = model.model.layers
    assert type(linear.linear_attn).__name__ == "Qwen3_5GatedDeltaNet"
    assert type(full.self_attn).__name__ == "Qwen3_5Attention"


def test_the_layer_pattern_is_qwen3_5s_with_full_attention_always_present() -> None:
    assert layer_types(4) == ["linear_attention"] * 3 + ["full_attention"]
    assert layer_types(8).count("full_attention") == 2 and layer_types(8)[3] == "full_attention"
    assert layer_types(2) == ["linear_attention", "full_attention"]
    assert layer_types(1) == ["full_attention"]


def test_the_same_seed_builds_the_same_bytes(qwen3_5_dir: Path, tmp_path: Path) -> None:
    again = family("qwen3_5").build_tiny(tmp_path / "again")
    for name in ("model.safetensors", "tokenizer.json", "config.json", "chat_template.jinja"):
        assert (again / name).read_bytes() == (qwen3_5_dir / name).read_bytes(), name


def _episode() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Looking.",
            "reasoning_content": "I need the tool.",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}},
                }
            ],
        },
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "<think>\nIt is sunny.\n</think>\n\nSunny."},
    ]


TOOLS_PREAMBLE = (
    "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
    + json.dumps(WEATHER)
    + "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\n"
    "multiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be "
    "nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function "
    "call, but NOT after\n- If there is no function call available, answer the question like normal with "
    "your current knowledge and do not tell the user about function calls\n</IMPORTANT>"
)


def test_the_template_renders_qwen3_5s_format(qwen3_5_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen3_5_dir)
    text = tokenizer.apply_chat_template(_episode(), tools=[WEATHER], tokenize=False)
    assert text == (
        TOOLS_PREAMBLE + "\n\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nI need the tool.\n</think>\n\nLooking.\n\n"
        + _xml_call("get_weather", city="Paris", days="3")
        + "<|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\nIt is sunny.\n</think>\n\nSunny.<|im_end|>\n"
    )
    # A new user query drops the earlier turns' reasoning; the generation prompt opens a think block.
    later = [*_episode(), {"role": "user", "content": "Thanks"}]
    text = tokenizer.apply_chat_template(later, tools=[WEATHER], tokenize=False, add_generation_prompt=True)
    assert "<think>\nI need" not in text and "<|im_start|>assistant\nLooking.\n\n<tool_call>" in text
    assert text.endswith(
        "<|im_start|>assistant\nSunny.<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    off = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert off == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_a_sampled_turn_renders_back_to_its_own_tokens(qwen3_5_dir: Path) -> None:
    """Within one user query a tool episode merges: the next prompt extends the last one and the
    completion sampled after it, once the completion is parsed and sent back."""
    tokenizer = AutoTokenizer.from_pretrained(qwen3_5_dir)
    messages = _episode()[:2]
    prompt = tokenizer.apply_chat_template(
        messages, tools=[WEATHER], add_generation_prompt=True, return_dict=False
    )
    sampled = _rendered_call(tokenizer)
    parsed = QWEN3_5.with_tools([WEATHER]).parse_text(sampled, tools=True)
    reply = {"role": "assistant", "content": parsed.content, "reasoning_content": parsed.reasoning_content}
    reply["tool_calls"] = [
        {**call, "function": {**call["function"], "arguments": json.loads(call["function"]["arguments"])}}
        for call in parsed.tool_calls
    ]
    following = [*messages, reply, {"role": "tool", "content": "sunny"}]
    after = tokenizer.apply_chat_template(
        following, tools=[WEATHER], add_generation_prompt=True, return_dict=False
    )
    completion = tokenizer(sampled + "<|im_end|>", add_special_tokens=False)["input_ids"]
    assert after[: len(prompt) + len(completion)] == prompt + completion


def test_the_parse_splits_reasoning_content_and_typed_calls() -> None:
    parsing = QWEN3_5.with_tools([WEATHER])
    both = parsing.parse_text(COMPLETIONS[1], tools=True)
    assert both.reasoning_content == "Two cities.\n"
    assert both.content == "Looking both up."
    assert [json.loads(call["function"]["arguments"]) for call in both.tool_calls] == [
        {"city": "Paris", "days": 3},
        {"city": "Oslo", "options": {"units": "metric", "hourly": False}},
    ]
    # Without the tools' schemas every value stays a string; without tools no call is returned,
    # but the calls still leave the content (vLLM's parser runs either way).
    untyped = QWEN3_5.parse_text(COMPLETIONS[0], tools=True).tool_calls[0]["function"]["arguments"]
    assert json.loads(untyped) == {"city": "Paris", "days": "3"}
    untold = QWEN3_5.parse_text(COMPLETIONS[4], tools=False)
    assert (untold.tool_calls, untold.content, untold.reasoning_content) == ([], None, "Checking.\n")
    off = QWEN3_5.parsing_for({"enable_thinking": False}).parse_text("Sunny.</think>", tools=True)
    assert (off.reasoning_content, off.content) == (None, "Sunny.")
    assert QWEN3_5.parsing_for({}) is QWEN3_5


def test_the_family_is_picked_by_its_parsers(qwen3_5_dir: Path, tiny_model_dir: Path) -> None:
    parsers = resolve_parsers(qwen3_5_dir)
    assert (parsers.tool_call, parsers.reasoning, parsers.family) == ("qwen3_coder", "qwen3", QWEN3_5)
    # Any model served with vLLM's qwen3_coder parser named is parsed by the hf engine as this family.
    assert parsing_family(resolve_parsers(tiny_model_dir, "qwen3_coder", "qwen3")) is QWEN3_5


def _rendered_call(tokenizer: Any) -> str:
    """The completion the template renders for the episode's first assistant turn."""
    text = tokenizer.apply_chat_template(_episode()[:3], tools=[WEATHER], tokenize=False)
    return text.split("<|im_start|>assistant\n<think>\n", 1)[1].removesuffix("<|im_end|>\n")


def _vllm_parse(
    vllm_parsers: VLLMParsers, model_dir: Path, cases: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    job = {
        "model_dir": str(model_dir),
        "tool_parser": "qwen3_coder",
        "reasoning_parser": "qwen3",
        "cases": cases,
    }
    return vllm_parsers(job)


@pytest.mark.vllm
def test_the_parse_returns_what_vllms_qwen3_coder_and_qwen3_parsers_return(
    qwen3_5_dir: Path, vllm_parsers: VLLMParsers
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen3_5_dir)
    cases = []
    for text in (*COMPLETIONS, _rendered_call(tokenizer)):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for tools in ([WEATHER], None):
            for thinking in (True, False):
                cases.append({"ids": ids, "tools": tools, "enable_thinking": thinking})
    theirs = _vllm_parse(vllm_parsers, qwen3_5_dir, cases)
    for case, vllm in zip(cases, theirs, strict=True):
        parsing = QWEN3_5.parsing_for({"enable_thinking": case["enable_thinking"]}).with_tools(case["tools"])
        ours = parsing.parse(tokenizer, case["ids"], tools=case["tools"] is not None)
        mine = {
            "reasoning": ours.reasoning_content,
            "content": ours.content,
            "tool_calls": [
                [call["function"]["name"], call["function"]["arguments"]] for call in ours.tool_calls
            ],
        }
        assert mine == vllm, (
            tokenizer.decode(case["ids"]),
            case["tools"] is not None,
            case["enable_thinking"],
        )
    # The rendered call (its first case: tools offered, thinking on) reads back as the call the
    # episode made, typed by the tool's schema.
    rendered = theirs[4 * len(COMPLETIONS)]
    assert rendered["reasoning"] == "I need the tool.\n" and rendered["content"] == "Looking."
    assert rendered["tool_calls"] == [["get_weather", json.dumps({"city": "Paris", "days": 3})]]
