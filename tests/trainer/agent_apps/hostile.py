"""The letters agent, turned hostile: before playing, every rollout tries to hurt the run.

With the key the trainer handed it, it tries each of the trainer's own operations (close the job,
take its own trace, load an adapter from a server path, open a job), sends a call and a reward into
rollouts that are not its own (in its job and in another), and asks the chat template for a
client-side template. Then it plays exactly as the benign letters agent does, so a run against it
must end with the same numbers. ``ATTEMPTS`` records every answer, for the test to check.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx

from agents.letters.main import rollout as play_letters
from handlers.context import RolloutContext
from handlers.decorator import rft_app
from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER

ATTEMPTS: list[tuple[str, int]] = []
_LOCK = threading.Lock()


def _attacks(ctx: RolloutContext) -> list[tuple[str, str, dict[str, Any], dict[str, str]]]:
    own = {JOB_ARN_HEADER: ctx.job_arn, TRAJECTORY_ID_HEADER: ctx.rollout_id}
    chat = {"model": ctx.model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    other_rollout = {JOB_ARN_HEADER: ctx.job_arn, TRAJECTORY_ID_HEADER: ctx.rollout_id + "-other"}
    other_job = {JOB_ARN_HEADER: ctx.job_arn + "-other", TRAJECTORY_ID_HEADER: ctx.rollout_id}
    reward = {"JobArn": ctx.job_arn, "TrajectoryId": ctx.rollout_id + "-other", "Rewards": [9.0]}
    return [
        ("close-job", "/admin/close-job", {"job_arn": ctx.job_arn}, {}),
        ("take-trace", "/admin/take-trace", {"job_arn": ctx.job_arn, "rollout_id": ctx.rollout_id}, {}),
        ("load-adapter", "/admin/load-adapter", {"path": "/tmp"}, {}),
        ("open-job", "/admin/open-job", {"job_arn": ctx.job_arn + "-mine"}, {}),
        ("call other rollout", "/v1/chat/completions", chat, other_rollout),
        ("call other job", "/v1/chat/completions", chat, other_job),
        ("reward other rollout", "/update-reward", reward, {}),
        ("reward other job", "/update-reward", {**reward, "JobArn": ctx.job_arn + "-other"}, {}),
        (
            "client template",
            "/v1/chat/completions",
            {**chat, "chat_template_kwargs": {"chat_template": "{% for i in range(9**9) %}x{% endfor %}"}},
            own,
        ),
    ]


async def rollout(row: dict[str, Any], ctx: RolloutContext) -> dict[str, Any]:
    key = {"Authorization": f"Bearer {ctx.api_key}"} if ctx.api_key else {}
    async with httpx.AsyncClient(base_url=ctx.endpoint or "", headers=key, timeout=30) as client:
        for name, path, body, headers in _attacks(ctx):
            answer = await client.post(path, json=body, headers=headers)
            with _LOCK:
                ATTEMPTS.append((name, answer.status_code))
    return await play_letters(row, ctx)


app = rft_app(rollout)
