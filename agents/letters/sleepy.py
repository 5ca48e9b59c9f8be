"""The letters agent, slowed down: each rollout first sleeps a seeded, long-tailed time.

The sleep is ``row["sleep_s"]`` times a log-normal draw (median 1, sigma 1, capped at 8) seeded by
the rollout's sampling seed, so a run's episode lengths are long-tailed yet the same on every repeat
and in every batch: the stand-in for agents whose episodes take unequal time (tool calls, long
games). Asynchronous training is measured (bench/async_overlap.py) and tested against it.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from agents.letters import main as letters
from handlers import RolloutContext, rft_app

MAX_FACTOR = 8.0


def sleep_seconds(scale: float, seed: int) -> float:
    """The seeded long-tailed delay of one rollout."""
    return scale * min(random.Random(seed).lognormvariate(0.0, 1.0), MAX_FACTOR)


async def rollout(row: dict[str, Any], ctx: RolloutContext) -> dict[str, Any]:
    seed = (ctx.inference_params.model_extra or {}).get("seed") or 0
    await asyncio.sleep(sleep_seconds(float(row.get("sleep_s", 0.0)), int(seed)))
    return await letters.rollout(row, ctx)


app = rft_app(rollout)
