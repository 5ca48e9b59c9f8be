"""Rollout fan-out against real agent apps on uvicorn, raw-socket transport faults and a stubbed AgentCore.

Agents: handlers' ``rft_app`` and a plain ``BedrockAgentCoreApp`` entrypoint (a service-style agent
that can misbehave in every way the trainer must survive), served by uvicorn on 127.0.0.1. Connection
drops and resets come from a raw TCP front that forwards every other request to the real app.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from bedrock_agentcore.runtime import BedrockAgentCoreApp
from botocore.response import StreamingBody
from botocore.stub import Stubber
from starlette.responses import JSONResponse, Response

from handlers.decorator import rft_app
from handlers.protocol import InferenceParams, RftkitExtras
from handlers.serving import ServingThread
from trainer.config import TrainConfig
from trainer.rollouts.fanout import FailureCause, Fanout, RolloutRequest, runtime_session_id
from trainer.rollouts.outcomes import (
    FailureCounts,
    RolloutOutcome,
    aggregate_rewards,
    group_is_trainable,
    resolve_reward,
)

JOB = "arn:aws:sagemaker:us-east-1:123456789012:training-job/rftkit-test"
ARN = "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/wordle-Ab12Cd34Ef"


def _closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


# Reports from rft_app go here and are refused at once: reporting failures are logged, never fatal.
NOWHERE = f"http://127.0.0.1:{_closed_port()}"


def _requests(rows: list[Any], **kwargs: Any) -> list[RolloutRequest]:
    return [
        RolloutRequest(
            row=row,
            rollout_id=f"g{index}-0-{uuid.uuid4().hex[:16]}",
            group_index=index,
            job_arn=JOB,
            endpoint=NOWHERE,
            **kwargs,
        )
        for index, row in enumerate(rows)
    ]


# --- agents ----------------------------------------------------------------------------------------


class MisbehavingAgent:
    """A plain AgentCore entrypoint whose row says how to (mis)behave."""

    def __init__(self) -> None:
        self.release = threading.Event()  # frees the handlers that hang, at teardown
        self.seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self.app = BedrockAgentCoreApp()
        self.app.entrypoint(self.handle)

    def handle(self, payload: dict[str, Any]) -> Any:
        row = payload["prompt"]
        rollout_id = payload["metadata"]["rolloutId"]
        with self._lock:
            self.seen[rollout_id] = self.seen.get(rollout_id, 0) + 1
            attempt = self.seen[rollout_id]
        mode = row["mode"]
        if mode == "ok":
            return {"status": "ready", "reward": row["reward"], "rewards": [row["reward"]]}
        if mode == "turns":
            return {"status": "ready", "rewards": row["rewards"], "metrics": {"turns": len(row["rewards"])}}
        if mode == "bare":
            return row["reward"]
        if mode == "hang":
            self.release.wait(30)
            return {"status": "ready", "reward": 1.0}
        if mode == "raise":
            raise RuntimeError("the game server is down")
        if mode == "bad_request":
            return JSONResponse({"error": "prompt has no secret word"}, status_code=400)
        if mode == "nan":
            return {"status": "ready", "reward": float("nan")}
        if mode == "no_report":
            return {"status": "ready"}
        if mode == "skip":
            return {"status": "skipped"}
        if mode == "failed":
            return {"status": "error", "error": "tool crashed"}
        if mode == "garbage":
            return Response(b"<html>hello</html>", media_type="text/html")
        if mode == "throttled":
            return JSONResponse({"error": "slow down"}, status_code=429)
        if mode == "flaky" and attempt == 1:
            return JSONResponse({"error": "warming up"}, status_code=503)
        if mode == "flaky":
            return {"status": "ready", "reward": 0.75}
        raise ValueError(f"unknown mode {mode}")


@pytest.fixture(scope="module")
def misbehaving_agent() -> Iterator[tuple[MisbehavingAgent, str]]:
    agent = MisbehavingAgent()
    server = ServingThread(agent.app).start()
    try:
        yield agent, server.url
    finally:
        agent.release.set()
        server.stop()


class DroppingFront:
    """A raw TCP front: drops or resets the connection when the row asks, else forwards to the agent."""

    def __init__(self, backend_port: int) -> None:
        self.backend_port = backend_port
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
            body = await reader.readexactly(length)
            mode = json.loads(body)["prompt"]["mode"]
            if mode == "drop":  # closed mid-request: no status line at all
                writer.close()
                return
            if mode == "reset":  # SO_LINGER 0: the close sends a TCP RST
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
            backend_reader, backend_writer = await asyncio.open_connection("127.0.0.1", self.backend_port)
            head = re.sub(rb"(?i)\r\nconnection:[^\r]*", b"", head)
            backend_writer.write(head[:-2] + b"Connection: close\r\n\r\n" + body)
            await backend_writer.drain()
            answer = await backend_reader.read()
            backend_writer.close()
            if b"connection: close" not in answer.split(b"\r\n\r\n", 1)[0].lower():
                line_end = answer.index(b"\r\n") + 2
                answer = answer[:line_end] + b"connection: close\r\n" + answer[line_end:]
            writer.write(answer)
            await writer.drain()
            writer.close()
        except (ConnectionError, asyncio.IncompleteReadError):
            writer.close()


# --- the mixed batch ---------------------------------------------------------------------------------

MIXED_ROWS: list[tuple[dict[str, Any], str | None]] = [
    ({"mode": "ok", "reward": 1.0}, None),
    ({"mode": "ok", "reward": 0.0}, None),
    ({"mode": "ok", "reward": -0.5}, None),
    ({"mode": "bare", "reward": 0.25}, None),
    ({"mode": "turns", "rewards": [0.5, 0.25, 1.0]}, None),
    ({"mode": "flaky"}, None),
    ({"mode": "hang"}, "timeout"),
    ({"mode": "hang"}, "timeout"),
    ({"mode": "raise"}, "agent_error"),
    ({"mode": "bad_request"}, "agent_error"),
    ({"mode": "failed"}, "agent_error"),
    ({"mode": "nan"}, "bad_reward"),
    ({"mode": "no_report"}, "no_report"),
    ({"mode": "skip"}, "skipped"),
    ({"mode": "garbage"}, "bad_response"),
    ({"mode": "throttled"}, "transport"),
    ({"mode": "drop"}, "transport"),
    ({"mode": "drop"}, "transport"),
    ({"mode": "reset"}, "transport"),
]


def test_mixed_faults_are_classified_exactly_and_nothing_outlives_the_deadline(
    misbehaving_agent: tuple[MisbehavingAgent, str],
) -> None:
    agent, url = misbehaving_agent
    timeout_s, max_retries = 1.5, 2
    backend_port = int(url.rsplit(":", 1)[1])

    async def play() -> tuple[list[RolloutRequest], list[RolloutOutcome], float]:
        async with DroppingFront(backend_port) as front:
            fanout = Fanout(
                [front], rollout_timeout_s=timeout_s, max_retries=max_retries, retry_backoff_s=0.05
            )
            async with fanout:
                requests = _requests([row for row, _ in MIXED_ROWS])
                started = time.monotonic()
                outcomes = await fanout.run(requests)
                return requests, outcomes, time.monotonic() - started

    requests, outcomes, elapsed = asyncio.run(play())

    assert elapsed < timeout_s + 1.0
    assert [o.rollout_id for o in outcomes] == [r.rollout_id for r in requests]
    for outcome, (row, cause) in zip(outcomes, MIXED_ROWS, strict=True):
        assert outcome.latency_s <= timeout_s + 0.25, (row, outcome)
        assert outcome.cause == (None if cause is None else FailureCause(cause)), (row, outcome)
        assert outcome.ok == (cause is None)
        assert (outcome.reward is None) == (cause is not None), "a failed rollout never carries a reward"

    counts = FailureCounts()
    counts.add(outcomes)
    assert counts.as_dict() == {
        "agent_error": 3,
        "timeout": 2,
        "transport": 4,
        "bad_reward": 1,
        "bad_response": 1,
        "skipped": 1,
        "no_report": 1,
        "model_calls_refused": 0,
        "no_model_calls": 0,
        "stalled": 0,
    }
    assert counts.total == 13

    by_mode = {row["mode"]: outcome for outcome, (row, _) in zip(outcomes, MIXED_ROWS, strict=True)}
    assert by_mode["flaky"].attempts == 2 and by_mode["flaky"].reward == 0.75
    assert by_mode["turns"].rewards == [0.5, 0.25, 1.0] and by_mode["turns"].reward == 1.75
    assert by_mode["turns"].metrics == {"turns": 3.0}
    assert by_mode["bare"].reward == 0.25
    for mode in ("throttled", "drop", "reset"):
        assert by_mode[mode].attempts == max_retries + 1, by_mode[mode]
    assert "HTTP 429: slow down" in by_mode["throttled"].error
    assert "RemoteProtocolError" in by_mode["drop"].error
    assert "ReadError" in by_mode["reset"].error
    for mode in ("raise", "bad_request", "failed", "nan", "skip", "garbage", "no_report"):
        assert by_mode[mode].attempts == 1, f"{mode} must not be retried"
    assert by_mode["raise"].error == "HTTP 500: the game server is down"
    assert by_mode["bad_request"].error == "HTTP 400: prompt has no secret word"
    assert by_mode["failed"].error == "tool crashed"
    # Only the retried transport failures reached the agent more than once.
    retried = {
        r.rollout_id
        for r, (row, _) in zip(requests, MIXED_ROWS, strict=True)
        if row["mode"] in ("flaky", "throttled")
    }
    assert {rid for rid, n in agent.seen.items() if n > 1} == retried


def test_retries_stop_when_the_deadline_does_not_allow_another_attempt(
    misbehaving_agent: tuple[MisbehavingAgent, str],
) -> None:
    _, url = misbehaving_agent

    async def play() -> list[RolloutOutcome]:
        async with Fanout([url], rollout_timeout_s=1.0, max_retries=10, retry_backoff_s=0.4) as fanout:
            return await fanout.run(_requests([{"mode": "throttled"}]))

    [outcome] = asyncio.run(play())
    assert outcome.latency_s <= 1.0
    assert outcome.cause == FailureCause.TRANSPORT
    assert 2 <= outcome.attempts <= 3  # 0.2-0.4 s, then 0.4-0.8 s of backoff; the next one cannot fit


def test_refused_connections_are_retried_then_counted_as_transport() -> None:
    async def play() -> list[RolloutOutcome]:
        target = f"http://127.0.0.1:{_closed_port()}"
        async with Fanout([target], rollout_timeout_s=5.0, max_retries=3, retry_backoff_s=0.01) as fanout:
            return await fanout.run(_requests([{"mode": "ok", "reward": 1.0}] * 2))

    for outcome in asyncio.run(play()):
        assert outcome.cause == FailureCause.TRANSPORT
        assert outcome.attempts == 4
        assert "ConnectError" in outcome.error


def test_bounded_concurrency(misbehaving_agent: tuple[MisbehavingAgent, str]) -> None:
    _, url = misbehaving_agent

    async def play() -> tuple[list[RolloutOutcome], int]:
        peak = 0
        async with Fanout([url], max_concurrent=3, rollout_timeout_s=10.0) as fanout:
            task = asyncio.ensure_future(fanout.run(_requests([{"mode": "ok", "reward": 1.0}] * 12)))
            while not task.done():
                peak = max(peak, sum(fanout.outstanding().values()))
                await asyncio.sleep(0)
            return task.result(), peak

    outcomes, peak = asyncio.run(play())
    assert all(outcome.ok for outcome in outcomes)
    assert 1 <= peak <= 3


def test_connections_are_kept_alive_and_bounded_by_the_concurrency() -> None:
    # Each concurrent rollout has its own client: at most max_concurrent connections per target,
    # reused from one rollout to the next and from one run to the next.
    clients: list[tuple[str, int]] = []

    async def agent(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        clients.append(scope["client"])
        while (await receive()).get("more_body", False):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"3")]})
        await send({"type": "http.response.body", "body": b"1.0"})

    async def play(urls: list[str]) -> list[RolloutOutcome]:
        async with Fanout(urls, max_concurrent=4, rollout_timeout_s=10.0) as fanout:
            first = await fanout.run(_requests([{"n": n} for n in range(30)]))
            return first + await fanout.run(_requests([{"n": n} for n in range(30)]))

    with ServingThread(agent) as one, ServingThread(agent) as two:
        outcomes = asyncio.run(play([one.url, two.url]))
    assert len(outcomes) == 60 and all(outcome.ok and outcome.reward == 1.0 for outcome in outcomes)
    assert len(clients) == 60
    assert 2 <= len(set(clients)) <= 2 * 4


# --- real rft_app agents ---------------------------------------------------------------------------------


class GatedGame:
    """An rft_app rollout that records what it was given and waits for a gate before answering."""

    def __init__(self, gate: threading.Event, delay_s: float = 0.0) -> None:
        self.gate = gate
        self.delay_s = delay_s
        self.calls: list[dict[str, Any]] = []

    def __call__(self, row: Any, ctx: Any) -> Any:
        self.calls.append(
            {
                "row": row,
                "job_arn": ctx.job_arn,
                "rollout_id": ctx.rollout_id,
                "endpoint": ctx.endpoint,
                "params": ctx.payload.inference_params,
                "model": ctx.payload.rftkit.model if ctx.payload.rftkit else None,
            }
        )
        self.gate.wait(10)
        time.sleep(self.delay_s)
        if row.get("raise"):
            raise ValueError("no such word")
        return float("nan") if row.get("nan") else row["rewards"]


@pytest.fixture
def two_agents() -> Iterator[tuple[list[GatedGame], list[str]]]:
    gate = threading.Event()
    games = [GatedGame(gate, delay_s=0.3), GatedGame(gate)]
    servers = [ServingThread(rft_app(game)).start() for game in games]
    try:
        yield games, [server.url for server in servers]
    finally:
        gate.set()
        for server in servers:
            server.stop()


def test_rft_app_agents_get_the_wire_payload_and_load_is_balanced(
    two_agents: tuple[list[GatedGame], list[str]],
) -> None:
    games, urls = two_agents
    rows = [{"secret": f"word{i}", "rewards": [0.5, float(i)]} for i in range(6)]
    params = InferenceParams(temperature=0.7, max_tokens=64, top_p=0.9)

    async def play() -> tuple[list[RolloutRequest], list[RolloutOutcome], dict[str, int]]:
        fanout = Fanout(urls, max_concurrent=8, rollout_timeout_s=10.0, reward_aggregation="mean")
        async with fanout:
            requests = _requests(rows, inference_params=params, extras=RftkitExtras(model="policy"))
            task = asyncio.ensure_future(fanout.run(requests))
            async with asyncio.timeout(10):
                while sum(fanout.outstanding().values()) < len(rows):
                    await asyncio.sleep(0.01)
            balanced = fanout.outstanding()
            games[0].gate.set()
            return requests, await task, balanced

    requests, outcomes, balanced = asyncio.run(play())

    assert balanced == {urls[0]: 3, urls[1]: 3}
    for index, outcome in enumerate(outcomes):
        assert outcome.ok and outcome.rewards == [0.5, float(index)]
        assert outcome.reward == pytest.approx((0.5 + index) / 2)
    calls = {call["rollout_id"]: call for game in games for call in game.calls}
    for request, row in zip(requests, rows, strict=True):
        call = calls[request.rollout_id]
        assert call["row"] == row
        assert (call["job_arn"], call["endpoint"], call["model"]) == (JOB, NOWHERE, "policy")
        assert call["params"].openai_params() == {"temperature": 0.7, "max_tokens": 64, "top_p": 0.9}


def test_fewest_outstanding_sends_more_work_to_the_faster_agent(
    two_agents: tuple[list[GatedGame], list[str]],
) -> None:
    games, urls = two_agents
    games[0].gate.set()  # agent 0 answers in 0.3 s, agent 1 at once

    async def play() -> list[RolloutOutcome]:
        async with Fanout(urls, max_concurrent=2, rollout_timeout_s=10.0) as fanout:
            return await fanout.run(_requests([{"rewards": 1.0}] * 12))

    outcomes = asyncio.run(play())
    assert all(outcome.ok for outcome in outcomes)
    served = [sum(outcome.target == url for outcome in outcomes) for url in urls]
    assert served[1] > served[0] >= 1  # taking turns would have served 6 and 6


def test_rft_app_failures_are_agent_errors_and_not_retried(
    two_agents: tuple[list[GatedGame], list[str]],
) -> None:
    games, urls = two_agents
    games[0].gate.set()

    async def play() -> list[RolloutOutcome]:
        async with Fanout([urls[1]], rollout_timeout_s=10.0) as fanout:
            return await fanout.run(_requests([{"raise": True}, {"nan": True}]))

    raised, nan = asyncio.run(play())
    assert (raised.cause, raised.attempts) == (FailureCause.AGENT_ERROR, 1)
    assert raised.error == "HTTP 500: ValueError: no such word"
    # rft_handler answers 400 for a reward that is not finite (the agent's bug), so it is an agent error.
    assert (nan.cause, nan.attempts) == (FailureCause.AGENT_ERROR, 1)
    assert "not a finite number" in nan.error


# --- AgentCore runtime ARNs ------------------------------------------------------------------------------


def _streaming(body: bytes) -> StreamingBody:
    return StreamingBody(io.BytesIO(body), len(body))


def test_agentcore_runtime_arn_through_the_real_service_model() -> None:
    client = boto3.client("bedrock-agentcore", region_name="us-east-1")
    request, throttled, invalid = _requests([{"secret": "crane"}, {"secret": "slate"}, {"secret": "x"}])
    regions: list[str] = []

    def expected(req: RolloutRequest) -> dict[str, Any]:
        return {
            "agentRuntimeArn": ARN,
            "runtimeSessionId": runtime_session_id(req.rollout_id),
            "payload": json.dumps(req.payload().to_wire()).encode(),
            "contentType": "application/json",
            "accept": "application/json",
            "qualifier": "DEFAULT",
        }

    answer = json.dumps({"status": "ready", "reward": 1.3, "rewards": [1.3]}).encode()
    with Stubber(client) as stub:
        stub.add_response(
            "invoke_agent_runtime",
            {"response": _streaming(answer), "contentType": "application/json", "statusCode": 200},
            expected(request),
        )
        stub.add_client_error(
            "invoke_agent_runtime",
            "ThrottlingException",
            "Rate exceeded",
            429,
            expected_params=expected(throttled),
        )
        stub.add_response(
            "invoke_agent_runtime",
            {"response": _streaming(b"[0.5, 0.25]"), "contentType": "application/json", "statusCode": 200},
            expected(throttled),
        )
        stub.add_client_error(
            "invoke_agent_runtime",
            "ValidationException",
            "bad payload",
            400,
            expected_params=expected(invalid),
        )

        def factory(region: str) -> Any:
            regions.append(region)
            return client

        async def play() -> list[RolloutOutcome]:
            fanout = Fanout(
                [ARN],
                max_concurrent=1,
                retry_backoff_s=0.01,
                agent_qualifier="DEFAULT",
                agentcore_client=factory,
            )
            async with fanout:
                return await fanout.run([request, throttled, invalid])

        ok, retried, rejected = asyncio.run(play())
        stub.assert_no_pending_responses()

    assert regions == ["us-east-1"]
    assert (ok.status, ok.reward, ok.attempts, ok.target) == ("ok", 1.3, 1, ARN)
    assert (retried.status, retried.rewards, retried.reward, retried.attempts) == ("ok", [0.5, 0.25], 0.75, 2)
    assert (rejected.cause, rejected.attempts) == (FailureCause.AGENT_ERROR, 1)
    assert "ValidationException" in rejected.error and "bad payload" in rejected.error
    wire = json.loads(expected(request)["payload"])
    assert wire == {
        "prompt": {"secret": "crane"},
        "metadata": {"jobArn": JOB, "rolloutId": request.rollout_id, "endpoint": NOWHERE},
    }
    session = runtime_session_id(request.rollout_id)
    assert 33 <= len(session) <= 100 and re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9-_]*", session)
    assert session == runtime_session_id(request.rollout_id) != runtime_session_id(throttled.rollout_id)


# --- rewards and groups (pure) ------------------------------------------------------------------------


def _outcome(reward: float | None, cause: FailureCause | None = None) -> RolloutOutcome:
    status = "ok" if cause is None else "failed"
    return RolloutOutcome("r", 0, status, cause, rewards=None if reward is None else [reward], reward=reward)


def test_reward_aggregation() -> None:
    assert aggregate_rewards([0.5, 0.25, 1.0], "sum") == 1.75
    assert aggregate_rewards([0.5, 0.25, 1.0], "last") == 1.0
    assert aggregate_rewards([0.5, 0.25, 1.5], "mean") == 0.75
    with pytest.raises(ValueError, match="empty"):
        aggregate_rewards([], "sum")


def test_resolve_reward_fills_in_from_update_reward_only_when_the_answer_had_none() -> None:
    pending = _outcome(None, FailureCause.NO_REPORT)
    filled = resolve_reward(pending, [1.0, 0.5], "last")
    assert (filled.status, filled.cause, filled.rewards, filled.reward) == ("ok", None, [1.0, 0.5], 0.5)
    assert resolve_reward(pending, [1.0, 0.5]).reward == 1.5
    assert resolve_reward(pending, None) is pending
    assert resolve_reward(pending, [float("inf")]).cause == FailureCause.BAD_REWARD
    answered = _outcome(2.0)
    assert resolve_reward(answered, [9.0]) is answered
    timed_out = _outcome(None, FailureCause.TIMEOUT)
    assert resolve_reward(timed_out, [1.0]) is timed_out


def test_group_is_trainable() -> None:
    ok = group_is_trainable([_outcome(1.0), _outcome(0.0), _outcome(None, FailureCause.TIMEOUT)])
    assert ok and ok.reason is None
    one = group_is_trainable([_outcome(1.0), _outcome(None, FailureCause.TRANSPORT)])
    # A group that fails for want of valid rollouts says why they failed.
    assert not one and one.reason == "only 1 valid rollout(s) of 2 (transport x1, first: (no error text))"
    flat = group_is_trainable([_outcome(0.5), _outcome(0.5), _outcome(None, FailureCause.AGENT_ERROR)])
    assert not flat and flat.reason == "no reward variance (all 2 rewards are 0.5)"
    assert not group_is_trainable([])


def test_request_payload_and_from_config() -> None:
    request = RolloutRequest({"secret": "crane"}, "r-1", 3, job_arn=JOB, endpoint="http://127.0.0.1:9/v1")
    assert request.payload().to_wire()["metadata"]["endpoint"] == "http://127.0.0.1:9"

    config = TrainConfig(agents=["http://a:1/", ARN], max_concurrent_rollouts=5, reward_aggregation="last")

    async def build() -> dict[str, int]:
        async with Fanout.from_config(config) as fanout:
            assert (fanout.reward_aggregation, fanout.max_retries) == ("last", config.max_retries)
            return fanout.outstanding()

    assert asyncio.run(build()) == {"http://a:1": 0, ARN: 0}
    with pytest.raises(ValueError, match="at least one agent target"):
        Fanout([])
