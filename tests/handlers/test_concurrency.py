"""32 concurrent rollouts on one app: each reaches the model with its own headers and reports its own reward.

Run over a real socket (the app on uvicorn, 127.0.0.1) and in process (httpx.ASGITransport), with an
async rollout (async OpenAI client, on the app's shared worker loop), a sync one (sync client, in the
app's thread pool) and, over the socket, a Strands agent on ``ctx.strands_model()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from handlers import RolloutContext, rft_app
from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER

ROLLOUTS = 32


def echo_rollout_id(body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    # The model answers with the rollout id it was called for, so a crossed header shows in the reward.
    return {"content": headers[TRAJECTORY_ID_HEADER.lower()]}


def reward_for(rollout_id: str) -> float:
    return float(rollout_id.removeprefix("rollout-")) / 4.0


def async_app() -> Any:
    async def rollout(row: Any, ctx: RolloutContext) -> float:
        async with ctx.async_openai_client() as client:
            completion = await client.chat.completions.create(
                model=ctx.model_id, messages=[{"role": "user", "content": row}], **ctx.openai_params()
            )
        return reward_for(completion.choices[0].message.content)

    return rft_app(rollout)


def strands_app() -> Any:
    from strands import Agent

    async def rollout(row: Any, ctx: RolloutContext) -> float:
        agent = Agent(model=ctx.strands_model(), callback_handler=None)
        result = await agent.invoke_async(row)
        return reward_for(str(result).strip())

    return rft_app(rollout)


def sync_app() -> Any:
    def rollout(row: Any, ctx: RolloutContext) -> float:
        with ctx.openai_client() as client:
            completion = client.chat.completions.create(
                model=ctx.model_id, messages=[{"role": "user", "content": row}], **ctx.openai_params()
            )
        return reward_for(completion.choices[0].message.content)

    return rft_app(rollout)


async def invoke_all(
    client: httpx.AsyncClient, endpoint: str, payload: Callable[..., Any]
) -> list[httpx.Response]:
    bodies = [
        payload(f"rollout-{index}", endpoint, prompt=f"row {index}", inferenceParams={"temperature": 0.5})
        for index in range(ROLLOUTS)
    ]
    return await asyncio.gather(*(client.post("/invocations", json=body) for body in bodies))


def message_text(message: dict[str, Any]) -> str:
    content = message["content"]
    return content if isinstance(content, str) else "".join(part["text"] for part in content)


def check(responses: list[httpx.Response], model: Any) -> None:
    for index, response in enumerate(responses):
        assert response.status_code == 200, response.text
        assert response.json()["reward"] == reward_for(f"rollout-{index}")
    assert len(model.calls) == ROLLOUTS
    # Every call carried its own rollout's headers and sampling parameters, and asked for its own row.
    for call in model.calls:
        job_arn, rollout_id = call.rollout
        assert job_arn == "arn:aws:sagemaker:us-west-2:111122223333:training-job/t"
        user_message = next(m for m in call.body["messages"] if m["role"] == "user")
        assert message_text(user_message) == f"row {rollout_id.removeprefix('rollout-')}"
        assert call.body["temperature"] == 0.5
        assert call.body["model"] == "default"
    assert sorted(call.rollout[1] for call in model.calls) == sorted(f"rollout-{i}" for i in range(ROLLOUTS))
    model.wait_for_reports(ROLLOUTS)
    for index in range(ROLLOUTS):
        rewards, completions = model.reports(f"rollout-{index}")
        assert [r["Rewards"] for r in rewards] == [[reward_for(f"rollout-{index}")]]
        assert [c["Status"] for c in completions] == ["ready"]
    # The rollouts really overlapped at the model.
    assert model.max_in_flight > 1


@pytest.mark.parametrize("make_app", [async_app, sync_app, strands_app], ids=["async", "sync", "strands"])
def test_concurrent_rollouts_over_a_real_socket(
    make_app: Callable[[], Any], model: Any, serve: Any, payload: Any
) -> None:
    model.script = echo_rollout_id
    model.delay_s = 0.05
    agent_url = serve(make_app())

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=agent_url, timeout=30) as client:
            return await invoke_all(client, model.url, payload)

    check(asyncio.run(run()), model)


@pytest.mark.parametrize("make_app", [async_app, sync_app], ids=["async", "sync"])
def test_concurrent_rollouts_in_process(make_app: Callable[[], Any], model: Any, payload: Any) -> None:
    model.script = echo_rollout_id
    model.delay_s = 0.05
    app = make_app()

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent", timeout=30) as client:
            return await invoke_all(client, model.url, payload)

    check(asyncio.run(run()), model)


def test_each_rollout_context_has_its_own_headers(payload: Any) -> None:
    from handlers.protocol import RolloutPayload

    contexts = [
        RolloutContext(RolloutPayload.model_validate(payload(f"r{i}", "http://m")), None) for i in range(3)
    ]
    headers = [ctx.headers for ctx in contexts]
    assert [h[TRAJECTORY_ID_HEADER] for h in headers] == ["r0", "r1", "r2"]
    headers[0][TRAJECTORY_ID_HEADER] = "changed"
    assert contexts[0].headers[TRAJECTORY_ID_HEADER] == "r0"
    assert all(
        h[JOB_ARN_HEADER] == "arn:aws:sagemaker:us-west-2:111122223333:training-job/t" for h in headers
    )
