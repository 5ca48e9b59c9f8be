"""An agent that fails on purpose: of every row's rollouts, the 3rd raises and the 4th overruns its deadline.

The first two rollouts of a row play :mod:`letters` normally. Counting arrivals per row (not rollout
ids) keeps the fault counts exact whatever order concurrent rollouts arrive in.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

from bedrock_agentcore.runtime import BedrockAgentCoreApp

from agents.letters.main import rollout as play_letters
from handlers.context import RolloutContext
from handlers.decorator import rft_app


def make_app(overrun_s: float) -> BedrockAgentCoreApp:
    """A fresh app (fresh counters); the 4th rollout of a row sleeps ``overrun_s`` after its first call."""
    arrivals: Counter[str] = Counter()
    lock = threading.Lock()

    async def rollout(row: dict[str, Any], ctx: RolloutContext) -> dict[str, Any]:
        with lock:
            arrivals[row["question"]] += 1
            arrival = arrivals[row["question"]]
        if arrival == 3:
            raise RuntimeError("the environment crashed")
        if arrival == 4:
            async with ctx.async_openai_client() as client:
                await client.chat.completions.create(
                    model=ctx.model_id, messages=[{"role": "user", "content": row["question"]}], max_tokens=4
                )
            await asyncio.sleep(overrun_s)
        return await play_letters(row, ctx)

    return rft_app(rollout)
