"""Agents that answer a reward whatever happened to their model calls, as agents commonly do (AWS's
Wordle sample among them): one catches every error and returns its no-play reward, one never calls
the model at all. Neither rollout may be scored."""

from __future__ import annotations

from typing import Any

import openai
from bedrock_agentcore.runtime import BedrockAgentCoreApp

from handlers.context import RolloutContext
from handlers.decorator import rft_app

NO_PLAY_REWARD = -1.5


def swallowing_app(api_key: str | None) -> BedrockAgentCoreApp:
    """Calls the model with ``api_key`` in place of the one handed to it; any error is swallowed."""

    async def rollout(row: dict[str, Any], ctx: RolloutContext) -> float:
        headers = {key: value for key, value in ctx.headers.items() if key != "Authorization"}
        client = openai.AsyncOpenAI(
            base_url=f"{ctx.endpoint}/v1", api_key=api_key or "none", default_headers=headers, max_retries=0
        )
        try:
            async with client:
                await client.chat.completions.create(
                    model=ctx.model_id, messages=[{"role": "user", "content": row["question"]}], max_tokens=4
                )
        except Exception:  # noqa: BLE001 - the point: the agent hides every failure
            return NO_PLAY_REWARD
        return 1.0

    return rft_app(rollout)


def modelless_app() -> BedrockAgentCoreApp:
    """Scores every row without a single model call."""

    async def rollout(row: dict[str, Any], ctx: RolloutContext) -> float:
        return float(len(row["question"]) % 3)

    return rft_app(rollout)
