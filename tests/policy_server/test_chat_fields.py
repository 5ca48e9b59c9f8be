"""Every field of OpenAI's chat-completions request is honoured or refused with a 400 naming it, on
the hf engine through the real gateway; the vllm engine's differences (tool_choice) at its request
body. The table is docs/chat-api.md."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from handlers import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER
from policy_server import PolicyServer, ServerThread
from policy_server.engines import GenerationRequest, HFEngine, VLLMEngine

JOB = "job-fields"
TOOLS = [{"type": "function", "function": {"name": "move", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[tuple[PolicyServer, str]]:
    server = PolicyServer(HFEngine(tiny_model_dir))
    thread = ServerThread(server).start()
    server.open_job(JOB, max_tokens=4, max_calls_per_rollout=10_000, auto_open_rollouts=True)
    try:
        yield server, thread.url
    finally:
        thread.stop()


def _post(url: str, rollout: str, **fields: Any) -> httpx.Response:
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}
    headers = {JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: rollout}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)


REFUSED = [
    ("n", {"n": 2}, "make n calls instead"),
    (
        "json_schema",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "response_format",
    ),
    ("json_object", {"response_format": {"type": "json_object"}}, "ask for JSON in the prompt"),
    ("logit_bias", {"logit_bias": {"42": 5.0}}, "logit_bias"),
    ("frequency_penalty", {"frequency_penalty": 0.5}, "frequency_penalty"),
    ("presence_penalty", {"presence_penalty": -0.5}, "presence_penalty"),
    ("top_logprobs", {"logprobs": True, "top_logprobs": 3}, "only the sampled tokens' logprobs"),
    ("modalities", {"modalities": ["text", "audio"]}, "modalities"),
    ("audio", {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ("prediction", {"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ("web_search_options", {"web_search_options": {}}, "web_search_options"),
    ("tool_choice required", {"tools": TOOLS, "tool_choice": "required"}, "tool_choice 'required'"),
    (
        "tool_choice named",
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "move"}}},
        "not enforced by the hf engine",
    ),
]


@pytest.mark.parametrize(("name", "fields", "words"), REFUSED, ids=[row[0] for row in REFUSED])
def test_refused_fields_answer_400_naming_the_field(
    served: tuple[PolicyServer, str], name: str, fields: dict[str, Any], words: str
) -> None:
    answer = _post(served[1], f"refused-{name}", **fields)
    assert answer.status_code == 400
    assert words in answer.json()["error"]["message"]


ACCEPTED = [
    ("response_format text", {"response_format": {"type": "text"}}),
    ("user", {"user": "agent-7"}),
    ("store", {"store": False}),
    ("metadata", {"metadata": {"run": "a"}}),
    ("service_tier", {"service_tier": "auto"}),
    ("parallel_tool_calls", {"tools": TOOLS, "parallel_tool_calls": False}),
    ("modalities text", {"modalities": ["text"]}),
    ("zero penalties", {"frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {}}),
    ("tool_choice auto", {"tools": TOOLS, "tool_choice": "auto"}),
    ("tool_choice none", {"tools": TOOLS, "tool_choice": "none"}),
    ("strict tools", {"tools": [{"type": "function", "function": {"name": "move", "strict": True}}]}),
]


@pytest.mark.parametrize(("name", "fields"), ACCEPTED, ids=[row[0] for row in ACCEPTED])
def test_fields_without_effect_here_are_accepted(
    served: tuple[PolicyServer, str], name: str, fields: dict[str, Any]
) -> None:
    assert _post(served[1], f"accepted-{name}", **fields).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_return_the_sampled_tokens_logprobs_the_trace_records(
    served: tuple[PolicyServer, str], stream: bool
) -> None:
    server, url = served
    rollout = f"logprobs-{stream}"
    answer = _post(url, rollout, logprobs=True, stream=stream)
    assert answer.status_code == 200
    if stream:
        chunks = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: {")]
        logprobs = next(
            c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0].get("logprobs")
        )
    else:
        logprobs = answer.json()["choices"][0]["logprobs"]
    call = server.take_trace(JOB, rollout).calls[0]
    assert [entry["token"] for entry in logprobs["content"]] == [
        f"token_id:{t}" for t in call.completion_token_ids
    ]
    assert [entry["logprob"] for entry in logprobs["content"]] == call.completion_logprobs
    without = _post(url, f"{rollout}-off")
    assert without.status_code == 200 and (stream or without.json()["choices"][0]["logprobs"] is None)


def test_the_vllm_engine_passes_tool_choice_through() -> None:
    """vLLM enforces `required` and named tools itself; the gateway forwards them unchanged."""
    engine = VLLMEngine("/models/any", python=sys.executable)
    for choice in ("required", {"type": "function", "function": {"name": "move"}}):
        request = GenerationRequest(
            messages=[{"role": "user", "content": "go"}], max_tokens=4, tools=TOOLS, tool_choice=choice
        )
        body = engine.request_body(request)
        assert body["tool_choice"] == choice and body["tools"] == TOOLS and body["logprobs"] is True
