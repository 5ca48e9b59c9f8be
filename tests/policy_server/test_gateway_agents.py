"""Real agents through the gateway on uvicorn with the hf engine and the tiny model: the Strands agent
loop (streaming, with a tool) and multi-turn OpenAI-client conversations, 16 rollouts at once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from strands import Agent, tool
from strands.models.openai import OpenAIModel
from strands.types.exceptions import MaxTokensReachedException

from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER
from policy_server import PolicyServer, RolloutTrace, ServerThread
from policy_server.engines.hf import HFEngine

JOB = "arn:aws:sagemaker:us-west-2:123456789012:training-job/agents"
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[tuple[PolicyServer, ServerThread]]:
    server = PolicyServer(HFEngine(tiny_model_dir))
    thread = ServerThread(server).start()
    server.open_job(JOB, max_tokens=MAX_TOKENS)
    try:
        yield server, thread
    finally:
        thread.stop()


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def _headers(rollout_id: str) -> dict[str, str]:
    return {JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: rollout_id}


def _extends(previous_prompt: list[int], previous_completion: list[int], prompt: list[int]) -> bool:
    """The trainer's merge rule: the next prompt continues prompt + completion token for token."""
    prefix = previous_prompt + previous_completion
    return prompt[: len(prefix)] == prefix


async def _strands_rollout(url: str, rollout_id: str, turns: int) -> list[dict[str, Any]]:
    model = OpenAIModel(
        client_args={"base_url": f"{url}/v1", "api_key": "unused", "default_headers": _headers(rollout_id)},
        model_id="default",
        params={"max_tokens": MAX_TOKENS, "temperature": 1.0},
    )
    agent = Agent(
        model=model, tools=[add], system_prompt="You add numbers with the add tool.", callback_handler=None
    )
    for turn in range(turns):
        try:
            await agent.invoke_async(f"{rollout_id} turn {turn}: add {turn} and 2.")
        except MaxTokensReachedException:
            # The untrained tiny model rarely stops by itself; the call was made and recorded all the same.
            pass
    return agent.messages


async def _openai_rollout(url: str, rollout_id: str, turns: int) -> list[Any]:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", default_headers=_headers(rollout_id))
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    responses = []
    async with client:
        for turn in range(turns):
            messages.append({"role": "user", "content": f"{rollout_id} turn {turn}"})
            response = await client.chat.completions.create(
                model="policy", messages=messages, max_tokens=MAX_TOKENS, seed=turn, tools=[_ADD_TOOL]
            )
            reply = response.choices[0].message
            messages.append({"role": "assistant", "content": reply.content or ""})
            responses.append(response)
    return responses


_ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}


def test_sixteen_concurrent_rollouts_each_get_their_own_ordered_trace(
    served: tuple[PolicyServer, ServerThread],
) -> None:
    server, thread = served
    strands_ids = [f"strands-{i}" for i in range(8)]
    openai_ids = [f"openai-{i}" for i in range(8)]
    for rollout_id in strands_ids + openai_ids:
        server.open_rollout(JOB, rollout_id)
    turns = 3

    async def play_all() -> tuple[list[Any], list[Any]]:
        strands = [_strands_rollout(thread.url, rollout_id, 2) for rollout_id in strands_ids]
        openai_ = [_openai_rollout(thread.url, rollout_id, turns) for rollout_id in openai_ids]
        results = await asyncio.gather(*strands, *openai_)
        return results[: len(strands)], results[len(strands) :]

    strands_histories, openai_responses = asyncio.run(play_all())
    traces: dict[str, RolloutTrace] = {r: server.take_trace(JOB, r) for r in strands_ids + openai_ids}

    report = []
    for rollout_id, history in zip(strands_ids, strands_histories, strict=True):
        trace = traces[rollout_id]
        assistant_turns = [m for m in history if m["role"] == "assistant"]
        assert len(trace.calls) == len(assistant_turns) >= 2
        for call in trace.calls:
            user_texts = [m["content"] for m in call.messages if m["role"] == "user"]
            assert all(text.startswith(f"{rollout_id} turn") for text in user_texts), user_texts
            assert [tool["function"]["name"] for tool in call.tools or []] == ["add"]
        report.append((rollout_id, _extension_report(trace)))
    for rollout_id, responses in zip(openai_ids, openai_responses, strict=True):
        trace = traces[rollout_id]
        assert [call.index for call in trace.calls] == list(range(turns))
        for turn, (call, response) in enumerate(zip(trace.calls, responses, strict=True)):
            assert call.messages[-1] == {"role": "user", "content": f"{rollout_id} turn {turn}"}
            assert call.prompt_token_ids == response.model_extra["prompt_token_ids"]
            assert call.completion_token_ids == response.choices[0].model_extra["token_ids"]
            assert len(call.completion_logprobs) == len(call.completion_token_ids) <= MAX_TOKENS
            assert response.usage.prompt_tokens == len(call.prompt_token_ids)
        report.append((rollout_id, _extension_report(trace)))

    for rollout_id, extends in report:
        print(f"{rollout_id}: calls extending the previous prompt+completion: {extends}")
    # In order: each call re-sends the conversation of the call before it, and started after it ended.
    for trace in traces.values():
        for previous, call in zip(trace.calls, trace.calls[1:], strict=False):
            assert call.messages[: len(previous.messages)] == previous.messages
            assert call.started_at >= previous.finished_at


def _extension_report(trace: RolloutTrace) -> list[bool]:
    return [
        _extends(previous.prompt_token_ids, previous.completion_token_ids, call.prompt_token_ids)
        for previous, call in zip(trace.calls, trace.calls[1:], strict=False)
    ]


def test_streaming_and_non_streaming_sample_the_same_tokens_for_a_seed(
    served: tuple[PolicyServer, ServerThread],
) -> None:
    server, thread = served
    # Two rollouts, one call each: the same seed at the same position in a rollout samples the same way.
    clients = {}
    for rollout_id in ("whole", "streamed"):
        server.open_rollout(JOB, rollout_id)
        clients[rollout_id] = openai.OpenAI(
            base_url=f"{thread.url}/v1", api_key="unused", default_headers=_headers(rollout_id)
        )
    request = {
        "model": "default",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Count"}, {"type": "text", "text": "!"}]}
        ],
        "max_tokens": MAX_TOKENS,
        "temperature": 1.0,
        "seed": 1234,
    }
    whole = clients["whole"].chat.completions.create(**request)
    chunks = list(
        clients["streamed"].chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
    )
    for client in clients.values():
        client.close()

    streamed_text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    finish = [chunk.choices[0] for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].finish_reason == whole.choices[0].finish_reason
    assert finish[0].model_extra["token_ids"] == whole.choices[0].model_extra["token_ids"]
    assert chunks[0].model_extra["prompt_token_ids"] == whole.model_extra["prompt_token_ids"]
    assert streamed_text == (whole.choices[0].message.content or "")
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage

    whole_trace, streamed_trace = server.take_trace(JOB, "whole"), server.take_trace(JOB, "streamed")
    assert whole_trace.calls[0].completion_token_ids == streamed_trace.calls[0].completion_token_ids
    assert whole_trace.calls[0].messages[0]["content"] == "Count\n!"


def test_a_rollout_seed_replays_the_rollout_and_its_calls_draw_independently(
    served: tuple[PolicyServer, ServerThread],
) -> None:
    """The same prompt sent four times in one rollout with its one seed: four different samples (the
    server mixes in each call's position), and a second rollout with that seed replays all four."""
    server, thread = served
    request = {
        "model": "default",
        "messages": [{"role": "user", "content": "Move."}],
        "max_tokens": MAX_TOKENS,
        "temperature": 1.0,
        "seed": 99,
    }
    samples = {}
    for rollout_id in ("first", "replay"):
        server.open_rollout(JOB, rollout_id)
        client = openai.OpenAI(
            base_url=f"{thread.url}/v1", api_key="unused", default_headers=_headers(rollout_id)
        )
        for _ in range(4):
            client.chat.completions.create(**request)
        client.close()
        samples[rollout_id] = [call.completion_token_ids for call in server.take_trace(JOB, rollout_id).calls]
    assert samples["first"] == samples["replay"]
    assert len({tuple(ids) for ids in samples["first"]}) == 4, samples["first"]
