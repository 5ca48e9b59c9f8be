"""Where the gateway's CPU goes on one chat call: each stage timed alone, and the whole app.

No vLLM: the engine hop goes to a stub server (its own process) that answers vLLM's JSON for an
8-token completion of a 30-token prompt, so only the gateway's side of each stage is timed here.
Stages, in a call's order:

- ``parse``: the body's JSON and pydantic validation (``parse_request``)
- ``generation_request``: the engine's view of the request
- ``admit``: the registry's checks and ``start_call``
- ``engine_hop``: ``VLLMEngine.generate``: the body sent to vLLM, aiohttp's round trip, the
  answer's JSON and its parsing (client-side CPU of this process, sequential calls);
  ``engine_hop_httpx``: the same hop through httpx, as the engine made it before
- ``record``: the call's ``CallRecord`` (messages clipped) into the rollout's trace
- ``response``: ``completion_body`` and Starlette's ``JSONResponse`` rendering
- ``app_total``: the whole Starlette app (auth, metrics, routes, disconnect watch) with an instant
  engine, driven over ASGI without a socket: all but uvicorn's HTTP parsing and the engine hop

    .venv/bin/python bench/gateway_cpu.py [--calls 2000]

Writes bench/results/gateway_cpu.json (microseconds of CPU per call, median of 5 repeats).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from starlette.responses import JSONResponse  # noqa: E402

from handlers import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER  # noqa: E402
from policy_server import JobLimits, JobRegistry, PolicyServer, call_record  # noqa: E402
from policy_server.engines import GenerationRequest, GenerationResult, VLLMEngine, free_port  # noqa: E402
from policy_server.http import CompletionIds, completion_body, generation_request, parse_request  # noqa: E402

JOB = "arn:aws:sagemaker:bench:job/gateway-cpu"
BODY = json.dumps(
    {
        "model": "default",
        "messages": [{"role": "user", "content": "Say something about mazes and words."}],
        "max_tokens": 8,
        "temperature": 1.0,
    }
).encode()
PROMPT_IDS = list(range(100, 130))
COMPLETION_IDS = list(range(200, 208))
VLLM_ANSWER = {
    "id": "chatcmpl-stub",
    "object": "chat.completion",
    "created": 0,
    "model": "policy",
    "prompt_token_ids": PROMPT_IDS,
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "eight tokens of a tiny model", "tool_calls": []},
            "logprobs": {
                "content": [
                    {"token": f"t{i}", "logprob": -1.5 - i / 10, "bytes": [116, 49], "top_logprobs": []}
                    for i in COMPLETION_IDS
                ]
            },
            "finish_reason": "length",
            "token_ids": COMPLETION_IDS,
        }
    ],
    "usage": {"prompt_tokens": 30, "completion_tokens": 8, "total_tokens": 38},
}
STUB_SERVER = """
import sys, uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
answer = sys.stdin.buffer.read()
async def chat(request): return Response(answer, media_type="application/json")
async def health(request): return Response(b"ok")
async def models(request): return Response(b'{"data": [{"id": "policy"}]}', media_type="application/json")
async def metrics(request): return Response(b"vllm:lora_requests_info 1")
async def unload(request): return Response(b"{}", media_type="application/json")
app = Starlette(routes=[
    Route("/v1/chat/completions", chat, methods=["POST"]), Route("/health", health),
    Route("/v1/models", models), Route("/metrics", metrics),
    Route("/v1/unload_lora_adapter", unload, methods=["POST"]),
])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def result() -> GenerationResult:
    return GenerationResult(
        prompt_token_ids=list(PROMPT_IDS),
        completion_token_ids=list(COMPLETION_IDS),
        completion_logprobs=[-1.5] * len(COMPLETION_IDS),
        logprobs_mode="raw",
        finish_reason="length",
        content="eight tokens of a tiny model here",
    )


class InstantEngine:
    """An engine that answers at once, so the app's own CPU is all that is timed."""

    model_name = "policy"

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        return result()

    async def load_adapter(self, version: int, path: str) -> None: ...

    async def unload_adapter(self, version: int) -> None: ...


def cpu_per_call_us(work: Callable[[], Any], calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        work()
    return 1e6 * (time.process_time() - start) / calls


async def async_cpu_per_call_us(work: Callable[[], Awaitable[Any]], calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        await work()
    return 1e6 * (time.process_time() - start) / calls


def sync_stages(calls: int) -> dict[str, Callable[[], float]]:
    chat = parse_request(BODY)
    generation = generation_request(chat, max_tokens_cap=1024)
    registry = JobRegistry()
    registry.open_job(JOB, JobLimits(max_calls_per_rollout=10**9, auto_open_rollouts=True))
    rollout = uuid.uuid4().hex
    ticket = registry.start_call(JOB, rollout)

    def admit() -> None:
        registry.limits(JOB)
        registry.check_rollout(JOB, rollout)
        registry.start_call(JOB, rollout)

    def record() -> None:
        done = result()
        # The server's own builder: what PolicyServer.complete records for every call.
        record = call_record(
            generation, done, index=ticket.sequence, adapter_version=0, started_at=0.0, finished_at=0.0
        )
        registry.record_call(ticket, record)

    def respond() -> None:
        JSONResponse(completion_body(result(), CompletionIds("policy")))

    return {
        "parse": lambda: cpu_per_call_us(lambda: parse_request(BODY), calls),
        "generation_request": lambda: cpu_per_call_us(
            lambda: generation_request(chat, max_tokens_cap=1024), calls
        ),
        "admit": lambda: cpu_per_call_us(admit, calls),
        "record": lambda: cpu_per_call_us(record, calls),
        "response": lambda: cpu_per_call_us(respond, calls),
    }


async def engine_hop_us(calls: int) -> dict[str, float]:
    """``VLLMEngine.generate`` (aiohttp) against the stub, and the same hop through httpx (what the
    engine used before), in one run."""
    port = free_port()
    stub = subprocess.Popen([sys.executable, "-c", STUB_SERVER, str(port)], stdin=subprocess.PIPE)
    assert stub.stdin is not None
    stub.stdin.write(json.dumps(VLLM_ANSWER).encode())
    stub.stdin.close()
    engine = VLLMEngine("unused", base_url=f"http://127.0.0.1:{port}", startup_timeout_s=60)
    generation = generation_request(parse_request(BODY), max_tokens_cap=1024)
    body = {**generation.__dict__, "model": "policy", "logprobs": True, "return_token_ids": True}

    async def through_httpx(client: httpx.AsyncClient) -> None:
        response = await client.post("/v1/chat/completions", json=body)
        engine._parse_completion(response.json())

    try:
        await engine.start()
        await engine.generate(generation)
        aiohttp_us = await async_cpu_per_call_us(lambda: engine.generate(generation), calls)
        async with httpx.AsyncClient(base_url=engine.base_url) as client:
            await through_httpx(client)
            httpx_us = await async_cpu_per_call_us(lambda: through_httpx(client), calls)
        return {"engine_hop": aiohttp_us, "engine_hop_httpx": httpx_us}
    finally:
        await engine.close()
        stub.terminate()
        stub.wait()


async def app_total_us(calls: int) -> float:
    server = PolicyServer(InstantEngine())  # type: ignore[arg-type]
    server.open_job(JOB, max_calls_per_rollout=10**9, auto_open_rollouts=True)
    app = server.app
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 5000),
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(BODY)).encode()),
            (JOB_ARN_HEADER.lower().encode(), JOB.encode()),
            (TRAJECTORY_ID_HEADER.lower().encode(), uuid.uuid4().hex.encode()),
        ],
    }

    async def one_call() -> None:
        sent = False
        never = asyncio.Event()

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": BODY, "more_body": False}
            await never.wait()  # the client stays connected
            return {"type": "http.disconnect"}

        statuses: list[int] = []

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        await app(dict(scope), receive, send)
        if statuses != [200]:
            raise RuntimeError(f"the app answered {statuses}")

    await one_call()
    return await async_cpu_per_call_us(one_call, calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "gateway_cpu.json")
    args = parser.parse_args()
    runs: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name, stage in sync_stages(args.calls).items():
            runs.setdefault(name, []).append(stage())
        for name, value in asyncio.run(engine_hop_us(args.calls)).items():
            runs.setdefault(name, []).append(value)
        runs.setdefault("app_total", []).append(asyncio.run(app_total_us(args.calls)))
    stages = {name: round(statistics.median(values), 1) for name, values in runs.items()}
    report = {"calls": args.calls, "repeats": args.repeats, "cpu_us_per_call": stages}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    for name, value in stages.items():
        print(f"{name:>20} {value:>8.1f} us")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
