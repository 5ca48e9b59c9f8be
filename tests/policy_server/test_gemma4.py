"""The Gemma 4 family: its template renders Gemma 4's format, its tiny model has Gemma 4's structure
and control tokens, and its parse reads completions as vLLM's own gemma4 parsers do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from policy_server.models.families import family, family_of
from tests.vllm_parsers import VLLMParsers

GEMMA4 = family("gemma4")
HERE = Path(__file__).resolve().parent

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city"},
                "days": {"type": "integer"},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "number"},
                "b": {"type": "number"},
                "exact": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "where": {"type": "object", "properties": {"x": {"type": "string"}}},
            },
        },
    },
}
DECLARATION = (
    '<|tool>declaration:get_weather{description:<|"|>Weather.<|"|>,parameters:{properties:{city:{'
    'description:<|"|>The city<|"|>,type:<|"|>STRING<|"|>},days:{type:<|"|>INTEGER<|"|>},unit:{enum:['
    '<|"|>c<|"|>,<|"|>f<|"|>],type:<|"|>STRING<|"|>}},required:[<|"|>city<|"|>],type:<|"|>OBJECT<|"|>}}'
    "<tool|>"
)
CALL = '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>'


def _call(name: str, arguments: dict[str, Any], call_id: str = "c1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "tool_calls": [_call("get_weather", {"city": "Paris", "days": 2})]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"celsius": 10}'},
    {"role": "assistant", "content": "It is 10 degrees."},
]


@pytest.fixture(scope="module")
def gemma4_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return GEMMA4.build_tiny(tmp_path_factory.mktemp("gemma4") / "model")


@pytest.fixture(scope="module")
def tokenizer(gemma4_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(gemma4_dir)


def render(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    text: str = tokenizer.apply_chat_template(messages, tools=[WEATHER], tokenize=False, **kwargs)
    return text


def test_the_template_renders_gemma4s_turns_declarations_calls_and_results(tokenizer: Any) -> None:
    head = f"<bos><|turn>system\nBe brief.{DECLARATION}<turn|>\n<|turn>user\nWeather in Paris?<turn|>\n"
    assert render(tokenizer, MESSAGES) == (
        f"{head}<|turn>model\n{CALL}"
        '<|tool_response>response:get_weather{value:<|"|>{"celsius": 10}<|"|>}<tool_response|>'
        "It is 10 degrees.<turn|>\n"
    )
    # Thinking off: the generation prompt holds an empty thought channel.
    assert render(tokenizer, MESSAGES[:2], add_generation_prompt=True) == (
        f"{head}<|turn>model\n<|channel>thought\n<channel|>"
    )
    # An unanswered call ends at the token the model stops at; after a result the turn stays open.
    assert render(tokenizer, MESSAGES[:3]) == f"{head}<|turn>model\n{CALL}<|tool_response>"
    assert render(tokenizer, MESSAGES[:4], add_generation_prompt=True).endswith("<tool_response|>")


def test_thinking_is_an_on_off_switch_that_keeps_the_reasoning_of_tool_turns(tokenizer: Any) -> None:
    thinking = [*MESSAGES[:2], {**MESSAGES[2], "reasoning_content": "Look it up."}, *MESSAGES[3:]]
    text = render(tokenizer, thinking, enable_thinking=True)
    assert text.startswith("<bos><|turn>system\n<|think|>\nBe brief.")
    assert f"<|turn>model\n<|channel>thought\nLook it up.\n<channel|>{CALL}" in text
    assert render(tokenizer, MESSAGES[:2], add_generation_prompt=True, enable_thinking=True).endswith(
        "<|turn>model\n"
    )
    # Reasoning of turns before the last user turn is dropped, as Gemma's template drops it.
    later = [*thinking, {"role": "user", "content": "And Oslo?"}]
    assert "Look it up." not in render(tokenizer, later, enable_thinking=True)
    refusal = GEMMA4.reasoning_effort_refusal("high")
    assert refusal is not None and "enable_thinking" in refusal


def test_the_tiny_model_has_gemma4s_structure_and_control_tokens(gemma4_dir: Path, tokenizer: Any) -> None:
    config = AutoConfig.from_pretrained(gemma4_dir)
    assert config.model_type == "gemma4_text" and config.architectures == ["Gemma4ForCausalLM"]
    assert config.layer_types == ["sliding_attention", "full_attention"]
    sliding, full = AutoModelForCausalLM.from_pretrained(gemma4_dir).model.layers
    # Global layers: twice the head size, one KV head, keys reused as values (Gemma 4 31B's layout).
    assert sliding.self_attn.head_dim == 64 and full.self_attn.head_dim == 128
    assert full.self_attn.k_proj.out_features == 128 and full.self_attn.v_proj is None
    assert family_of(gemma4_dir) is GEMMA4
    for token in (
        "<|turn>",
        "<turn|>",
        "<|tool_call>",
        "<tool_call|>",
        "<|tool_response>",
        '<|"|>',
        "<|channel>",
    ):
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    stops = GenerationConfig.from_pretrained(gemma4_dir).eos_token_id
    assert set(tokenizer.convert_ids_to_tokens(stops)) == {"<turn|>", "<|tool_response>", "<eos>"}


def test_parse_reads_calls_reasoning_and_content_typed_by_the_tools_schemas() -> None:
    text = (
        '<|channel>thought\nCheck.<channel|>Sure.<|tool_call>call:add{a:3.0,b:<|"|>4.5<|"|>,exact:true,'
        'tags:[<|"|>x<|"|>,7],where:{x:<|"|>a, b<|"|>}}<tool_call|>'
    )
    parsed = GEMMA4.with_tools([WEATHER, ADD]).parse_text(text, tools=True)
    assert parsed.reasoning_content == "Check." and parsed.content == "Sure."
    [call] = parsed.tool_calls
    assert call["function"]["name"] == "add"
    assert json.loads(call["function"]["arguments"]) == {
        "a": 3,
        "b": 4.5,
        "exact": True,
        "tags": ["x", "7"],
        "where": {"x": "a, b"},
    }
    # Without the tool's schema every value stays a string, as vLLM leaves it.
    [untyped] = GEMMA4.parse_text(text, tools=True).tool_calls
    assert json.loads(untyped["function"]["arguments"])["a"] == "3.0"
    # Without tools offered the call is still taken out of the content, as vLLM does.
    assert GEMMA4.parse_text(f"Hi.{CALL}", tools=False).tool_calls == []
    assert GEMMA4.parse_text("  plain  ", tools=True).content == "  plain  "


def _completions(tokenizer: Any) -> list[str]:
    """Completions the tiny template renders: the text the model writes after the prompt."""
    conversations = [
        ([*MESSAGES[:2], {"role": "assistant", "tool_calls": [_call("add", {"a": 3, "b": 4.5})]}], {}),
        (
            [
                *MESSAGES[:2],
                {
                    "role": "assistant",
                    "reasoning_content": "Two calls.",
                    "tool_calls": [
                        _call("get_weather", {"city": "Paris", "unit": "c"}, "c1"),
                        _call("add", {"exact": False, "tags": ["a", "b c"], "where": {"x": "y"}}, "c2"),
                    ],
                },
            ],
            {"enable_thinking": True},
        ),
        ([*MESSAGES[:2], MESSAGES[4]], {}),
    ]
    texts = []
    for messages, kwargs in conversations:
        prompt = tokenizer.apply_chat_template(messages[:2], tools=[WEATHER, ADD], tokenize=False, **kwargs)
        full = tokenizer.apply_chat_template(messages, tools=[WEATHER, ADD], tokenize=False, **kwargs)
        completion = full[len(prompt) + len("<|turn>model\n") :]
        texts.append(completion.removesuffix("<|tool_response>").removesuffix("<turn|>\n"))
    return texts


@pytest.mark.vllm
def test_vllm_gemma4_parsers_read_rendered_calls_as_this_family_does(
    gemma4_dir: Path, tokenizer: Any, vllm_parsers: VLLMParsers
) -> None:
    texts = [
        *_completions(tokenizer),
        "thought\nhmm<channel|>Answer",
        '<|tool_call>call:add{a:<|"|>pa',
        '<|tool_call>call:add{a:3.0,b:<|"|>7<|"|>,exact:1,tags:[1,<|"|>z<|"|>],where:{x:2}}<tool_call|>',
        '<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,days:two,extra:5}<tool_call|>',
    ]
    cases = [
        {"ids": tokenizer.encode(text, add_special_tokens=False), "tools": tools, "enable_thinking": False}
        for text in texts
        for tools in ([WEATHER, ADD], None)
    ]
    theirs = vllm_parsers(
        {"model_dir": str(gemma4_dir), "tool_parser": "gemma4", "reasoning_parser": "gemma4", "cases": cases}
    )
    ours = []
    for case in cases:
        parsed = GEMMA4.with_tools(case["tools"]).parse(
            tokenizer, case["ids"], tools=case["tools"] is not None
        )
        calls = [[call["function"]["name"], call["function"]["arguments"]] for call in parsed.tool_calls]
        ours.append({"reasoning": parsed.reasoning_content, "content": parsed.content, "tool_calls": calls})
    assert ours == theirs
    # The calls come back as the template rendered them.
    assert theirs[0]["tool_calls"] == [["add", '{"a": 3, "b": 4.5}']]
    assert theirs[2]["reasoning"] == "Two calls."
    assert [name for name, _ in theirs[2]["tool_calls"]] == ["get_weather", "add"]
    assert json.loads(theirs[2]["tool_calls"][1][1]) == {
        "exact": False,
        "tags": ["a", "b c"],
        "where": {"x": "y"},
    }
    assert theirs[4] == {"reasoning": None, "content": "It is 10 degrees.", "tool_calls": []}


def test_vllm_sampling_is_refused_for_the_lora_modules_it_cannot_serve_as_the_learner_computes() -> None:
    gemma4 = family("gemma4")
    refusal = gemma4.vllm_lora_refusal("all-linear")
    assert refusal is not None and refusal.startswith(
        "vLLM cannot sample a LoRA on k_proj of the gemma4 family as the learner computes it (k_proj: "
        "served with other logprobs; docs/models.md, gemma4), and lora.target_modules is all-linear: "
        "leave it out, e.g. lora.target_modules: [q_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]"
    )
    named = gemma4.vllm_lora_refusal(["embed_tokens", "q_proj", "v_proj", "lm_head"])
    assert named is not None and "embed_tokens, lm_head: the adapter refused at load" in named
    assert "leave them out, e.g. lora.target_modules: [q_proj, v_proj]" in named
    assert gemma4.vllm_lora_refusal(["q_proj", "v_proj", "o_proj"]) is None
    assert family("llama").vllm_lora_refusal("all-linear") is None
