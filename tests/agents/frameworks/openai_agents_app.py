"""A tool-calling agent on the OpenAI Agents SDK (import name `agents`), wrapped with ``rft_app``.

Runs in the frameworks environment: ``python openai_agents_app.py PORT``. A row is
``{"question": "What is 2 + 3?", "answer": 5, "stream": false}``; ``stream`` picks
``Runner.run_streamed`` over ``Runner.run``.
"""

from __future__ import annotations

import sys
from typing import Any

from openai import AsyncOpenAI

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from handlers import RolloutContext, rft_app

set_tracing_disabled(True)  # no trace export to OpenAI's servers


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number.
        b: the second number.
    """
    return a + b


async def rollout(row: dict[str, Any], ctx: RolloutContext) -> dict[str, Any]:
    client = AsyncOpenAI(
        base_url=f"{ctx.endpoint}/v1", api_key=ctx.api_key or "none", default_headers=ctx.headers
    )
    model = OpenAIChatCompletionsModel(model=ctx.model_id, openai_client=client)
    params = ctx.inference_params
    agent = Agent(
        name="adder",
        instructions="Use the add tool, then answer with the number.",
        tools=[add],
        model=model,
        model_settings=ModelSettings(temperature=params.temperature, max_tokens=params.max_tokens),
    )
    if row.get("stream"):
        streamed = Runner.run_streamed(agent, row["question"], max_turns=4)
        async for _ in streamed.stream_events():
            pass
        final = str(streamed.final_output)
    else:
        final = str((await Runner.run(agent, row["question"], max_turns=4)).final_output)
    solved = str(row["answer"]) in final
    return {"reward": 1.0 if solved else len(final) % 3 / 4, "metrics": {"final_chars": float(len(final))}}


app = rft_app(rollout)

if __name__ == "__main__":
    app.run(port=int(sys.argv[1]))
