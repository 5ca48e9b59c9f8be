"""The tiny offline model, its chat template, and the hermes tool-call parser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from policy_server.http.chat_format import normalize_messages, parse_tool_calls
from policy_server.models.model_cli import tiny_model_main as main
from policy_server.models.tiny import (
    END_OF_TEXT,
    IM_END,
    IM_START,
    TOOL_CALL_END,
    TOOL_CALL_START,
    TOOL_RESPONSE_END,
    TOOL_RESPONSE_START,
    build_tiny_model,
)

MOVE_TOOL = {
    "type": "function",
    "function": {
        "name": "move",
        "description": "Move one step.",
        "parameters": {"type": "object", "properties": {"direction": {"type": "string"}}},
    },
}
LOOK_TOOL = {
    "type": "function",
    "function": {"name": "look", "parameters": {"type": "object", "properties": {}}},
}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def render(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **kw: Any
) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kw)


def ids(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> list[int]:
    return tokenizer.apply_chat_template(
        normalize_messages(messages), tools=tools, add_generation_prompt=True, return_dict=False
    )


def test_model_and_tokenizer_load_with_auto_classes(tiny_model_dir: Path, tokenizer: Any) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    tokenizer_config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["model_type"] == "llama" and config["head_dim"] == 64
    assert config["hidden_size"] // config["num_attention_heads"] == 64
    assert (tiny_model_dir / "model.safetensors").exists()

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.dtype == torch.float32
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.eos_token_id == tokenizer.convert_tokens_to_ids(IM_END)
    assert set(model.generation_config.eos_token_id) == {
        tokenizer.convert_tokens_to_ids(IM_END),
        tokenizer.convert_tokens_to_ids(END_OF_TEXT),
    }
    for token in (
        IM_START,
        IM_END,
        END_OF_TEXT,
        TOOL_CALL_START,
        TOOL_CALL_END,
        TOOL_RESPONSE_START,
        TOOL_RESPONSE_END,
    ):
        assert tokenizer.encode(token, add_special_tokens=False) == [tokenizer.convert_tokens_to_ids(token)]
    # Tool tags survive skip_special_tokens (vLLM's hermes parser needs them in the text).
    tagged = tokenizer.encode(
        f'{TOOL_CALL_START}\n{{"a": 1}}\n{TOOL_CALL_END}{IM_END}', add_special_tokens=False
    )
    assert (
        tokenizer.decode(tagged, skip_special_tokens=True)
        == f'{TOOL_CALL_START}\n{{"a": 1}}\n{TOOL_CALL_END}'
    )

    prompt = torch.tensor([ids(tokenizer, [{"role": "user", "content": "hello"}])])
    logits = model(prompt).logits
    assert logits.shape == (1, prompt.shape[1], len(tokenizer))


def test_build_is_seeded_and_corpus_shapes_the_vocabulary(tmp_path: Path, tiny_model_dir: Path) -> None:
    maze_text = (
        "<tool_call>\n"
        + json.dumps({"name": "walk_maze_north", "arguments": {"steps": 3}})
        + "\n</tool_call>"
    )
    same = build_tiny_model(tmp_path / "same", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1, corpus=[maze_text] * 50)
    base_weights = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    same_weights = AutoModelForCausalLM.from_pretrained(same).state_dict()
    other_weights = AutoModelForCausalLM.from_pretrained(other).state_dict()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(base_weights[name], same_weights[name])
    assert not torch.equal(base_weights[name], other_weights[name])
    plain = AutoTokenizer.from_pretrained(same)
    fitted = AutoTokenizer.from_pretrained(other)
    assert len(fitted.encode(maze_text)) < len(plain.encode(maze_text))


def test_builder_rejects_head_dim_other_than_64(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="head_dim 64"):
        build_tiny_model(tmp_path / "bad", hidden_size=128, num_heads=4)


def test_cli_builds_a_loadable_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("go north\ngo south\n")
    assert main([str(tmp_path / "cli"), "--seed", "3", "--corpus", str(corpus), "--num-layers", "1"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli")
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "cli").config.num_hidden_layers == 1
    assert main([str(tmp_path / "x"), "--corpus", str(tmp_path / "missing.txt")]) == 2
    assert "cannot read corpus file" in capsys.readouterr().err


def test_template_renders_tools_calls_results_and_generation_prompt(tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "Walk the maze."},
        {"role": "user", "content": [{"type": "text", "text": "Start "}, {"type": "text", "text": "now."}]},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "a",
                    "type": "function",
                    "function": {"name": "move", "arguments": '{"direction": "up"}'},
                },
                {"id": "b", "type": "function", "function": {"name": "look", "arguments": {}}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "moved"},
        {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "a wall"}]},
    ]
    text = render(tokenizer, messages, [MOVE_TOOL, LOOK_TOOL], add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nWalk the maze.\n\n# Tools\n\nTo call a function, write <tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\nFunctions:\n<tools>\n'
        + json.dumps(MOVE_TOOL)
        + "\n"
        + json.dumps(LOOK_TOOL)
        + "\n</tools><|im_end|>\n"
        "<|im_start|>user\nStart \nnow.<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "move", "arguments": {"direction": "up"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "look", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nmoved\n</tool_response>\n"
        "<tool_response>\na wall\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_template_without_tools_or_system_and_with_content_beside_calls(tokenizer: Any) -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "move"},
        {
            "role": "assistant",
            "content": "Going up.",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "move", "arguments": {"d": "é"}}}
            ],
        },
    ]
    assert render(tokenizer, messages) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
        "<|im_start|>user\nmove<|im_end|>\n"
        "<|im_start|>assistant\nGoing up.\n"
        '<tool_call>\n{"name": "move", "arguments": {"d": "é"}}\n</tool_call>'
        "<|im_end|>\n"
    )
    assert render(tokenizer, [{"role": "system", "content": "S"}]) == "<|im_start|>system\nS<|im_end|>\n"


def test_string_and_dict_arguments_render_identically(tokenizer: Any) -> None:
    arguments = {"direction": "left", "steps": [1, 2], "note": "naïve"}

    def conversation(args: Any) -> list[dict[str, Any]]:
        call = {"id": "x", "type": "function", "function": {"name": "move", "arguments": args}}
        return [{"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": [call]}]

    as_dict = render(tokenizer, conversation(arguments), [MOVE_TOOL])
    assert render(tokenizer, conversation(json.dumps(arguments, ensure_ascii=False)), [MOVE_TOOL]) == as_dict
    # Other spellings of the same JSON (compact, ASCII-escaped, as clients re-serialise) render the
    # same once normalised.
    for spelling in (json.dumps(arguments, separators=(",", ":")), json.dumps(arguments)):
        assert render(tokenizer, normalize_messages(conversation(spelling)), [MOVE_TOOL]) == as_dict


def test_template_is_prefix_preserving_across_a_tool_conversation(tokenizer: Any) -> None:
    """prompt(k) + sampled completion + <|im_end|> is a token prefix of prompt(k+1)."""
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    completions = [
        '<tool_call>\n{"name": "move", "arguments": {"direction": "up"}}\n</tool_call>',
        'A wall.\n<tool_call>\n{"name": "look", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "move", "arguments": {"direction": "left", "note": "café"}}\n</tool_call>',
        "\n\n  I reached the goal!  \n",
    ]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Solve it."},
        {"role": "user", "content": [{"type": "text", "text": "#S.#\n#.G#"}]},
    ]
    tools = [MOVE_TOOL, LOOK_TOOL]
    for turn, completion in enumerate(completions):
        prompt_ids = ids(tokenizer, messages, tools)
        sampled = tokenizer.encode(completion, add_special_tokens=False) + [im_end]
        content, tool_calls = parse_tool_calls(completion)
        # What a client (Strands) sends back: arguments as json.dumps strings, no content key when none.
        assistant: dict[str, Any] = {"role": "assistant"}
        if content is not None:
            assistant["content"] = content
        if tool_calls:
            assistant["tool_calls"] = [
                {
                    **call,
                    "function": {
                        **call["function"],
                        "arguments": json.dumps(json.loads(call["function"]["arguments"])),
                    },
                }
                for call in tool_calls
            ]
        messages.append(assistant)
        for call in tool_calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"ok {turn}"})
        if not tool_calls:
            messages.append({"role": "user", "content": [{"type": "text", "text": "Again?"}]})
        next_ids = ids(tokenizer, messages, tools)
        assert next_ids[: len(prompt_ids) + len(sampled)] == prompt_ids + sampled, f"turn {turn}"


def test_parser_reads_one_and_several_calls() -> None:
    content, calls = parse_tool_calls(
        '<tool_call>\n{"name": "move", "arguments": {"direction": "up"}}\n</tool_call>'
    )
    assert content is None
    assert len(calls) == 1 and calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["function"] == {"name": "move", "arguments": '{"direction": "up"}'}

    content, calls = parse_tool_calls(
        'Two moves.\n<tool_call>{"name": "move", "arguments": "{\\"direction\\": \\"up\\"}"}</tool_call>\n'
        '<tool_call>\n{"name": "look"}\n</tool_call>'
    )
    assert content == "Two moves."
    assert [call["function"] for call in calls] == [
        {"name": "move", "arguments": '{"direction": "up"}'},
        {"name": "look", "arguments": "{}"},
    ]
    assert calls[0]["id"] != calls[1]["id"]


def test_parser_keeps_malformed_blocks_as_content() -> None:
    assert parse_tool_calls("just text ") == ("just text ", [])
    assert parse_tool_calls("") == (None, [])
    broken = '<tool_call>\n{"name": "move", "arguments": {"direction": \n</tool_call>'
    assert parse_tool_calls(broken) == (broken, [])
    for bad in (
        '{"arguments": {}}',
        '["move"]',
        '{"name": "", "arguments": {}}',
        '{"name": "m", "arguments": 3}',
    ):
        text = f"<tool_call>{bad}</tool_call>"
        assert parse_tool_calls(text) == (text, [])
    content, calls = parse_tool_calls(
        f'{broken}\n<tool_call>{{"name": "look", "arguments": {{}}}}</tool_call>'
    )
    assert content == broken and [call["function"]["name"] for call in calls] == ["look"]
    unclosed = '<tool_call>{"name": "move", "arguments": {}}'
    assert parse_tool_calls(unclosed) == (unclosed, [])


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_parser_never_raises(text: str) -> None:
    content, calls = parse_tool_calls(text)
    assert content is None or isinstance(content, str)
    for call in calls:
        assert isinstance(json.loads(call["function"]["arguments"]), dict)


@settings(max_examples=100, deadline=None)
@given(
    st.text(min_size=1, max_size=12).filter(lambda s: "<" not in s),
    st.dictionaries(
        st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=8), st.booleans()), max_size=4
    ),
)
def test_parser_round_trips_rendered_calls(name: str, arguments: dict[str, Any]) -> None:
    block = (
        "<tool_call>\n"
        + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        + "\n</tool_call>"
    )
    content, calls = parse_tool_calls(block)
    assert content is None
    assert calls[0]["function"]["name"] == name
    assert json.loads(calls[0]["function"]["arguments"]) == arguments


def test_normalize_messages_leaves_the_input_alone() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"x":1}'}}]},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "not json"}}]},
    ]
    before = json.dumps(messages)
    normalized = normalize_messages(messages)
    assert json.dumps(messages) == before
    assert normalized[0]["content"] == "a\nb"
    assert normalized[1]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert normalized[2]["tool_calls"][0]["function"]["arguments"] == "not json"
    assert "content" not in normalized[1]


def test_rft_model_tiny_is_rft_tiny_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from handlers.cli import main as rft

    assert rft(["model", "tiny", str(tmp_path / "new"), "--num-layers", "1"]) == 0
    assert rft(["tiny-model", str(tmp_path / "old"), "--num-layers", "1"]) == 0
    assert (tmp_path / "new" / "model.safetensors").read_bytes() == (
        tmp_path / "old" / "model.safetensors"
    ).read_bytes()
    capsys.readouterr()
    assert rft(["model", "llama"]) == 2
    assert "unknown model 'llama'; choose one of: tiny, tiny-vision, smollm2" in capsys.readouterr().err
