"""Abuse of the policy server, as an attacker or a careless client would try it (bounded in time).

Each test is one finding of the security review: the agents' key opens no admin route, adapters
load only from the adapters directory, client template arguments are allow-listed without hurting
the rest of a batch, stop strings, trace text and auto-opened rollouts are bounded, abandoned
calls stop taking the engine's time, stalled sockets are closed.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

import policy_server.http.bodies as bodies
from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER
from policy_server import PolicyServer, ServerThread
from policy_server.engines.hf import HFEngine
from policy_server.jobs import JobLimits, JobRegistry, Rejection
from policy_server.trace import RECORDED_TEXT_CHARS

API_KEY = "agents-key"
ADMIN_KEY = "trainer-admin-key"
AGENT = {"Authorization": f"Bearer {API_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
ADMIN_ROUTES = [
    ("POST", "/admin/open-job", {"job_arn": "job-x"}),
    ("POST", "/admin/close-job", {"job_arn": "job-x"}),
    ("POST", "/admin/open-rollout", {"job_arn": "job-x", "rollout_id": "r"}),
    ("POST", "/admin/take-trace", {"job_arn": "job-x", "rollout_id": "r"}),
    ("POST", "/admin/load-adapter", {"path": "/tmp"}),
    ("GET", "/admin/counters", None),
]


@pytest.fixture(scope="module")
def adapters_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("adapters")


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, adapters_dir: Path) -> Iterator[tuple[PolicyServer, ServerThread]]:
    engine = HFEngine(tiny_model_dir)
    server = PolicyServer(engine, api_key=API_KEY, admin_key=ADMIN_KEY, adapters_dir=adapters_dir)
    thread = ServerThread(server, header_timeout_s=0.5).start()
    try:
        yield server, thread
    finally:
        thread.stop()


def _sentence(response: httpx.Response) -> str:
    error = response.json()["error"]
    message = error["message"] if isinstance(error, dict) else error
    assert message[:1].isupper() and len(message.split()) >= 4, message
    return message


def _admin_call(client: httpx.Client, method: str, path: str, body: Any, **kw: Any) -> httpx.Response:
    if method == "GET":
        return client.get(path, params={"job_arn": "job-x"}, **kw)
    return client.post(path, json=body, **kw)


def _chat_headers(job: str, rollout: str) -> dict[str, str]:
    return {**AGENT, JOB_ARN_HEADER: job, TRAJECTORY_ID_HEADER: rollout}


def _chat(content: str = "hello", **fields: Any) -> dict[str, Any]:
    return {"model": "default", "messages": [{"role": "user", "content": content}], "max_tokens": 4, **fields}


def test_the_agents_key_opens_no_admin_route(served: tuple[PolicyServer, ServerThread]) -> None:
    server, thread = served
    server.open_job("job-x")
    server.open_rollout("job-x", "r")
    with httpx.Client(base_url=thread.url, timeout=30) as client:
        for method, path, body in ADMIN_ROUTES:
            agent = _admin_call(client, method, path, body, headers=AGENT)
            assert agent.status_code == 403 and "agents' key" in _sentence(agent), path
            anonymous = _admin_call(client, method, path, body)
            assert anonymous.status_code == 401 and "admin key" in _sentence(anonymous), path
        # Nothing happened: the job and its rollout are as they were.
        assert server.registry.open_rollout_count("job-x") == 1
        assert client.get("/admin/counters", params={"job_arn": "job-x"}, headers=ADMIN).status_code == 200
    server.close_job("job-x")


def test_without_an_admin_key_no_admin_route_is_served(tiny_model_dir: Path) -> None:
    server = PolicyServer(HFEngine(tiny_model_dir), api_key=API_KEY)
    with TestClient(server.app) as client:
        for method, path, body in ADMIN_ROUTES:
            for headers in (AGENT, {}, {"Authorization": "Bearer anything"}):
                response = _admin_call(client, method, path, body, headers=headers)
                assert response.status_code == 403 and "not served over HTTP" in _sentence(response)
    with pytest.raises(ValueError, match="must differ"):
        PolicyServer(HFEngine(tiny_model_dir), api_key="same", admin_key="same")


def test_adapters_load_only_from_the_adapters_directory(
    served: tuple[PolicyServer, ServerThread],
    adapters_dir: Path,
    tmp_path: Path,
    random_adapter: Callable[..., Path],
) -> None:
    server, thread = served
    outside = random_adapter(tmp_path / "outside", seed=5)
    inside = adapters_dir / "v-good"
    shutil.copytree(outside, inside)
    (adapters_dir / "escape").symlink_to(outside)
    with httpx.Client(base_url=thread.url, headers=ADMIN, timeout=60) as client:

        def load(path: str) -> httpx.Response:
            return client.post("/admin/load-adapter", json={"path": path})

        for path in (str(outside), "../" + outside.name, str(adapters_dir / ".." / "x"), "escape"):
            refused = load(path)
            assert refused.status_code == 403 and "only from inside" in _sentence(refused), path
        assert load("a" * 5000).status_code == 400  # over the path length a request may carry
        long_name = load("a" * 4000)  # within it, but too long for the filesystem
        assert long_name.status_code == 400 and "not a peft adapter" in _sentence(long_name)
        before = server.current_adapter_version
        loaded = load("v-good")
        assert loaded.status_code == 200 and loaded.json() == {"version": before + 1}


def test_a_failed_adapter_load_leaves_the_served_model_untouched(
    tiny_model_dir: Path, tmp_path: Path, random_adapter: Callable[..., Path]
) -> None:
    from peft.tuners.tuners_utils import BaseTunerLayer

    from policy_server.engines.base import GenerationRequest

    good = random_adapter(tmp_path / "good", seed=6)
    broken = tmp_path / "broken"
    shutil.copytree(good, broken)
    (broken / "adapter_model.safetensors").write_bytes(b"not safetensors")
    request = GenerationRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0.0)

    async def scenario() -> None:
        engine = HFEngine(tiny_model_dir)
        await engine.start()
        try:
            base = (await engine.generate(request)).completion_token_ids
            with pytest.raises(Exception):  # noqa: B017 - whatever safetensors raises for a bad file
                await engine.load_adapter(1, str(broken))
            assert not any(isinstance(m, BaseTunerLayer) for m in engine._model.modules())
            assert (await engine.generate(request)).completion_token_ids == base
            # Once adapters exist, a failed load leaves them and the base model as they were.
            await engine.load_adapter(2, str(good))
            on_good = GenerationRequest(**{**request.__dict__, "adapter_version": 2})
            with_good = await engine.generate(on_good)
            with pytest.raises(Exception):  # noqa: B017
                await engine.load_adapter(3, str(broken))
            assert set(engine._model.peft_config) == {"v2"}
            assert (await engine.generate(request)).completion_token_ids == base
            again = await engine.generate(on_good)
            assert again.completion_token_ids == with_good.completion_token_ids
        finally:
            await engine.close()

    asyncio.run(scenario())


BAD_TEMPLATE_KWARGS = [
    {"chat_template": "{% for i in range(10**9) %}{% for j in range(10**9) %}x{% endfor %}{% endfor %}"},
    {"tokenize": False},
    {"return_tensors": "pt"},
    {"return_dict": True},
    {"enable_thinking": {"nested": [1, 2]}},
    {"reasoning_effort": "x" * 1000},
]


def test_template_kwargs_outside_the_allow_list_get_400_and_spare_the_batch(
    served: tuple[PolicyServer, ServerThread],
) -> None:
    server, thread = served
    job = "job-kwargs"
    server.open_job(job, max_tokens=6, auto_open_rollouts=True)

    async def innocent(client: httpx.AsyncClient, index: int, run: str) -> list[int]:
        kwargs = {"enable_thinking": False}
        body = _chat(f"question {index}", seed=index, max_tokens=6, chat_template_kwargs=kwargs)
        headers = _chat_headers(job, f"{run}-ok-{index}")
        answer = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        return answer.json()["choices"][0]["token_ids"]

    async def hostile(client: httpx.AsyncClient, index: int) -> httpx.Response:
        body = _chat(chat_template_kwargs=BAD_TEMPLATE_KWARGS[index % len(BAD_TEMPLATE_KWARGS)])
        headers = _chat_headers(job, f"bad-{index}")
        return await client.post("/v1/chat/completions", json=body, headers=headers)

    async def run(with_hostile: bool) -> tuple[list[list[int]], list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=thread.url, timeout=60) as client:
            run = "mixed" if with_hostile else "alone"
            good = [innocent(client, index, run) for index in range(16)]
            bad = [hostile(client, index) for index in range(12)] if with_hostile else []
            results = await asyncio.gather(*good, *bad)
        return list(results[:16]), list(results[16:])

    alone, _ = asyncio.run(run(with_hostile=False))
    mixed, refused = asyncio.run(run(with_hostile=True))
    assert mixed == alone  # same seeds, same tokens: the bad requests changed nothing
    for response in refused:
        assert response.status_code == 400
        assert "chat_template_kwargs" in _sentence(response)
    # A refused request opened no rollout of the auto-opening job.
    assert server.registry.open_rollout_count(job) == 32
    server.close_job(job)


def test_stop_strings_names_and_trace_text_are_bounded(served: tuple[PolicyServer, ServerThread]) -> None:
    server, thread = served
    job = "job-bounds"
    server.open_job(job, max_tokens=4)
    server.open_rollout(job, "r")
    headers = _chat_headers(job, "r")
    with httpx.Client(base_url=thread.url, timeout=60) as client:
        for stop in (["s"] * 10_000, ["x" * 10_000]):
            response = client.post("/v1/chat/completions", json=_chat(stop=stop), headers=headers)
            assert response.status_code == 400 and "stop" in _sentence(response)
        named = {"role": "user", "content": "hi", "name": "n" * 1000}
        response = client.post("/v1/chat/completions", json=_chat(messages=[named]), headers=headers)
        assert response.status_code == 400 and "name" in _sentence(response)
        # A field the template does not render may be as large as the body limit; the record keeps
        # a bounded part of it.
        heavy = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "ok", "reasoning_content": "r" * 2_000_000},
            {"role": "user", "content": "go on"},
        ]
        response = client.post("/v1/chat/completions", json=_chat(messages=heavy), headers=headers)
        assert response.status_code == 200, response.text
    trace = server.take_trace(job, "r")
    assert len(trace.calls) == 1
    assert len(json.dumps(trace.calls[0].messages)) < RECORDED_TEXT_CHARS + 1000
    assert "chars not kept" in trace.calls[0].messages[1]["reasoning_content"]
    server.close_job(job)


def test_an_auto_opening_job_caps_its_rollouts_and_opens_only_valid_ones(
    served: tuple[PolicyServer, ServerThread],
) -> None:
    server, thread = served
    job = "job-auto"
    server.open_job(job, max_tokens=4, auto_open_rollouts=True, max_open_rollouts=3)
    with httpx.Client(base_url=thread.url, timeout=60) as client:

        def call(rollout: str, body: dict[str, Any]) -> httpx.Response:
            return client.post("/v1/chat/completions", json=body, headers=_chat_headers(job, rollout))

        assert call("invalid-1", {"model": "default"}).status_code == 400
        assert call("invalid-2", _chat(model="other")).status_code == 404
        assert call("invalid-3", _chat(max_tokens=99)).status_code == 400
        assert server.registry.open_rollout_count(job) == 0
        for index in range(3):
            assert call(f"r{index}", _chat()).status_code == 200
        over = call("r3", _chat())
        assert over.status_code == 429 and "open rollouts" in _sentence(over)
        feedback = {"JobArn": job, "TrajectoryId": "r4", "Rewards": [1.0]}
        assert client.post("/update-reward", json=feedback, headers=AGENT).status_code == 404
        assert call("r0", _chat()).status_code == 200  # open ones still play
    server.close_job(job)


def test_feedback_with_fresh_ids_opens_no_rollout_and_idle_ones_expire(
    served: tuple[PolicyServer, ServerThread],
) -> None:
    """1,100 reports naming fresh rollout ids on an open job (cap 1,024) open nothing: a new rollout
    is still served. Rollouts a job opened on its own and left idle give their slots back."""
    server, thread = served
    job = "job-feedback"
    server.open_job(job, max_tokens=4, auto_open_rollouts=True)
    with httpx.Client(base_url=thread.url, headers=AGENT, timeout=60) as client:
        for index in range(1100):
            ids = {"JobArn": job, "TrajectoryId": f"fresh-{index}"}
            route, body = (
                ("/update-reward", {**ids, "Rewards": [1.0]})
                if index % 2
                else ("/complete-rollout", {**ids, "Status": "ready"})
            )
            answer = client.post(route, json=body)
            assert answer.status_code == 404 and "not open" in _sentence(answer)
        assert server.registry.open_rollout_count(job) == 0
        chat = client.post("/v1/chat/completions", json=_chat(), headers=_chat_headers(job, "innocent"))
        assert chat.status_code == 200
    server.close_job(job)


def test_an_open_jobs_idle_rollouts_give_their_slots_back() -> None:
    registry = JobRegistry()
    registry.open_job("job", JobLimits(auto_open_rollouts=True, max_open_rollouts=2, idle_rollout_s=0.2))
    registry.start_call("job", "a")
    registry.start_call("job", "b")
    with pytest.raises(Rejection) as caught:
        registry.start_call("job", "c")
    assert caught.value.status_code == 429
    time.sleep(0.3)
    registry.start_call("job", "b")  # b is active again; a stays idle
    registry.start_call("job", "c")  # takes a's slot
    assert registry.open_rollout_count("job") == 2
    with pytest.raises(Rejection) as caught:
        registry.start_call("job", "a")
    assert caught.value.status_code == 409  # forgotten ids count as finished


def test_calls_and_feedback_reach_only_the_rollout_their_headers_name(
    served: tuple[PolicyServer, ServerThread],
) -> None:
    server, thread = served
    for job in ("job-a", "job-b"):
        server.open_job(job, max_tokens=4)
        server.open_rollout(job, "shared-id")
    with httpx.Client(base_url=thread.url, headers=AGENT, timeout=60) as client:
        headers = _chat_headers("job-a", "shared-id")
        assert client.post("/v1/chat/completions", json=_chat(), headers=headers).is_success
        reward = {"JobArn": "job-b", "TrajectoryId": "shared-id", "Rewards": [0.5]}
        assert client.post("/update-reward", json=reward).is_success
        assert client.post("/update-reward", json={**reward, "TrajectoryId": "nobody"}).status_code == 404
    a, b = server.take_trace("job-a", "shared-id"), server.take_trace("job-b", "shared-id")
    assert (len(a.calls), a.rewards) == (1, None)
    assert (len(b.calls), b.rewards) == (0, [0.5])
    server.close_job("job-a")
    server.close_job("job-b")


def test_abandoned_calls_stop_taking_the_engines_time(served: tuple[PolicyServer, ServerThread]) -> None:
    server, thread = served
    engine = server.engine
    assert isinstance(engine, HFEngine)
    job, dropped, max_tokens, leave_after = "job-drop", 8, 1500, 16
    server.open_job(job, max_tokens=max_tokens, auto_open_rollouts=True)

    async def drop_all() -> list[int]:
        """Tokens of each answer (0 for a call its client left): every client leaves once the engine
        has sampled ``leave_after`` tokens a call, counted, not timed, so how fast a machine samples
        does not change what is left to abandon."""
        async with httpx.AsyncClient(base_url=thread.url, timeout=60) as client:
            calls = [
                asyncio.ensure_future(
                    client.post(
                        "/v1/chat/completions",
                        json=_chat(
                            f"tell a long story number {index}", max_tokens=max_tokens, temperature=0.0
                        ),
                        headers=_chat_headers(job, f"d{index}"),
                    )
                )
                for index in range(dropped)
            ]
            while engine.stats.completion_tokens - started < dropped * leave_after:
                if all(call.done() for call in calls):
                    break
                await asyncio.sleep(0.01)
            for call in calls:
                call.cancel()  # a call already answered keeps its answer
            await asyncio.gather(*calls, return_exceptions=True)
        return [
            0 if call.cancelled() else len(call.result().json()["choices"][0]["token_ids"]) for call in calls
        ]

    started = engine.stats.completion_tokens
    answered = asyncio.run(drop_all())
    deadline = time.monotonic() + 300  # long enough for the abandoned calls to run to their end
    while (engine._batch is not None or engine._pending) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine._batch is None and not engine._pending
    # A greedy answer that meets EOS within its first tokens is whole.
    left = answered.count(0)
    assert left >= dropped // 2, answered
    spent = engine.stats.completion_tokens - started - sum(answered)
    # Each abandoned call left the batch a few steps after its client did (before calls were
    # cancelled, these greedy rows ran on to 3,547 tokens): far from a quarter of its max_tokens.
    assert spent < left * max_tokens / 4, (spent, answered)

    before = engine.stats.completion_tokens
    with httpx.Client(base_url=thread.url, timeout=60) as client:
        headers = _chat_headers(job, "new")
        answer = client.post("/v1/chat/completions", json=_chat(max_tokens=4), headers=headers)
    assert answer.status_code == 200
    # The engine did this call's work and nothing else's.
    assert engine.stats.completion_tokens - before == len(answer.json()["choices"][0]["token_ids"])
    server.close_job(job)


def test_stalled_sockets_and_bodies_are_cut_off(
    served: tuple[PolicyServer, ServerThread], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, thread = served
    sockets = []
    for index in range(40):
        sock = socket.create_connection(("127.0.0.1", thread.port))
        if index % 2:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # headers never end
        sockets.append(sock)
    for sock in sockets:
        sock.settimeout(10)
        assert sock.recv(1024) == b"", "the server kept a stalled connection open"
        sock.close()

    monkeypatch.setattr(bodies, "BODY_READ_TIMEOUT_S", 0.5)
    with socket.create_connection(("127.0.0.1", thread.port)) as sock:
        head = (
            b"POST /update-reward HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + API_KEY.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        sock.sendall(head)
        sock.settimeout(10)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive" in answer
