"""A tool-calling agent on LangGraph (``create_react_agent`` over langchain-openai's ``ChatOpenAI``),
wrapped with ``rft_app``.

Runs in the frameworks environment: ``python langgraph_app.py PORT``. A row is
``{"question": "What is 2 + 3?", "answer": 5, "stream": false}``; ``stream`` makes ``ChatOpenAI``
stream its calls.
"""

from __future__ import annotations

import sys
from typing import Any

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

from handlers import RolloutContext, rft_app


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def rollout(row: dict[str, Any], ctx: RolloutContext) -> dict[str, Any]:
    params = ctx.inference_params
    llm = ChatOpenAI(
        model=ctx.model_id,
        base_url=f"{ctx.endpoint}/v1",
        api_key=ctx.api_key or "none",
        default_headers=ctx.headers,
        temperature=params.temperature,
        max_tokens=params.max_tokens,
        streaming=bool(row.get("stream")),
        max_retries=0,
    )
    agent = create_react_agent(llm, [add], prompt="Use the add tool, then answer with the number.")
    result = await agent.ainvoke({"messages": [("user", row["question"])]}, {"recursion_limit": 8})
    final = str(result["messages"][-1].content)
    solved = str(row["answer"]) in final
    return {"reward": 1.0 if solved else len(final) % 3 / 4, "metrics": {"final_chars": float(len(final))}}


app = rft_app(rollout)

if __name__ == "__main__":
    app.run(port=int(sys.argv[1]))
