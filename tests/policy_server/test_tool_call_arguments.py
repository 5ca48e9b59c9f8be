"""Tool calls whose arguments do not parse against the request's tools are unparsed calls (issue 50,
item 4): the gateway records why, for gpt_oss's harmony calls and hermes ``<tool_call>`` blocks alike,
and passes the call to the agent as the parser read it (as vLLM and OpenAI do)."""

from __future__ import annotations

from typing import Any

import pytest

from policy_server.engines.base import GenerationRequest, GenerationResult
from policy_server.models.families import family, tool_call_problem
from policy_server.recording import call_record, unparsed_reason

DECIDE = {
    "type": "function",
    "function": {
        "name": "decide",
        "parameters": {
            "type": "object",
            "properties": {
                "choice": {"type": "string", "enum": ["approve", "reject"]},
                "amount": {"type": "number"},
                "notes": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["choice"],
        },
    },
}


SCHEMA = "the arguments of 'decide' do not match its schema: "


def _harmony(arguments: str) -> str:
    return f"<|channel|>commentary to=functions.decide <|constrain|>json<|message|>{arguments}"


def _hermes(arguments: str) -> str:
    return f'<tool_call>\n{{"name": "decide", "arguments": {arguments}}}\n</tool_call>'


def _problem(family_name: str, text: str, finish_reason: str = "tool_calls", max_tokens: int = 64) -> Any:
    parsed = family(family_name).parse_text(text, tools=True)
    generation = GenerationRequest(messages=[], max_tokens=max_tokens, tools=[DECIDE])
    result = GenerationResult([1], [2] * 8, [-0.1] * 8, "raw", finish_reason, parsed.content)
    result.tool_calls = parsed.tool_calls
    return unparsed_reason(generation, result), parsed


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ('{"choice": "approve", "amount": 12.5, "notes": ["ok"]}', None),
        ('{"choice": "approve", "amount": 3}', None),  # an integer is a number
        ("{}", f"{SCHEMA}the arguments lack the required 'choice'"),
        ('{"choice": 1}', f"{SCHEMA}choice is integer, the schema asks for string"),
        ('{"choice": "maybe"}', f"{SCHEMA}choice is 'maybe', not one of ['approve', 'reject']"),
        ('{"choice": "no", "notes": ["a", 2]}', f"{SCHEMA}choice is 'no', not one of ['approve', 'reject']"),
        ('{"choice": "reject", "notes": [2]}', f"{SCHEMA}notes[0] is integer, the schema asks for string"),
    ],
)
def test_arguments_against_the_schema_gpt_oss_and_hermes(arguments: str, reason: str | None) -> None:
    for name, text in (("gpt_oss", _harmony(arguments)), ("llama", _hermes(arguments))):
        found, parsed = _problem(name, text)
        assert len(parsed.tool_calls) == 1, name
        assert found == reason, name


def test_truncated_json_arguments_reach_the_agent_raw_and_count_as_unparsed() -> None:
    # gpt-oss cut off inside its arguments: the issue's `decide({})`.
    found, parsed = _problem("gpt_oss", _harmony('{"choice": "appr'))
    (call,) = parsed.tool_calls
    assert call["function"]["arguments"] == '{"choice": "appr'  # as vLLM passes it
    assert found == "the arguments of 'decide' are not JSON: '{\"choice\": \"appr'"
    # hermes: a cut block stays text with its marker (and no call).
    found, parsed = _problem("qwen3", '<tool_call>\n{"name": "decide", "arguments": {"choice": "appr')
    assert parsed.tool_calls == [] and found == "a tool-call marker is left in the reply's content"
    # Calls in a completion that filled max_tokens: the last one may be cut short.
    found, parsed = _problem("gpt_oss", _harmony('{"choice": "approve"}'), max_tokens=8)
    assert found == "the completion was cut off by the token limit inside its tool calls"
    # ... where the engine cannot tell (vLLM); the hf engine says it ended at its stop token instead.
    stopped = GenerationResult([1], [2] * 8, [-0.1] * 8, "raw", "tool_calls", None, parsed.tool_calls)
    stopped.truncated = False
    assert unparsed_reason(GenerationRequest(messages=[], max_tokens=8, tools=[DECIDE]), stopped) is None
    found, _ = _problem("gpt_oss", _harmony('{"choice": "approve"}'), finish_reason="length", max_tokens=99)
    assert found == "the completion was cut off by the token limit inside its tool calls"


def test_a_call_to_a_tool_the_request_did_not_offer_and_schemaless_tools() -> None:
    call = {"function": {"name": "delete", "arguments": "{}"}}
    assert tool_call_problem(call, [DECIDE]) == "it calls 'delete', which the request's tools do not offer"
    free = {"type": "function", "function": {"name": "delete", "parameters": {}}}
    assert tool_call_problem({"function": {"name": "delete", "arguments": '{"x": [1]}'}}, [free]) is None
    assert tool_call_problem({"function": {"name": "delete", "arguments": "[1]"}}, [free]) == (
        "the arguments of 'delete' are not a JSON object"
    )


def test_the_record_keeps_truncation_answer_and_reason() -> None:
    generation = GenerationRequest(messages=[], max_tokens=4, tools=[DECIDE])
    reasoning_only = GenerationResult([1], [2, 3, 4, 5], [-0.1] * 4, "raw", "length", None, [], "thinking")
    record = call_record(generation, reasoning_only, index=0, adapter_version=0, started_at=0, finished_at=0)
    assert (record.truncated, record.answered, record.unparsed_tool_call) == (True, False, False)
    parsed = family("gpt_oss").parse_text(_harmony("{}"), tools=True)
    called = GenerationResult([1], [2], [-0.1], "raw", "tool_calls", parsed.content, parsed.tool_calls)
    record = call_record(generation, called, index=1, adapter_version=0, started_at=0, finished_at=0)
    assert (record.truncated, record.answered, record.unparsed_tool_call) == (False, True, True)
    assert record.unparsed_reason is not None and "lack the required 'choice'" in record.unparsed_reason
