"""What the policy gateway costs on top of vLLM: added latency per call and throughput.

Starts one vLLM server (from vLLM's own environment) and one `rft serve` gateway attached to it, both
as separate processes, then drives the same chat request through each from this process at 1, 16 and
64 concurrent clients. Rounds alternate direct/gateway so machine noise hits both alike; the report
gives medians over rounds.

    .venv/bin/python bench/gateway_overhead.py [--rounds 3] [--requests-per-client 20]

Writes bench/results/gateway_overhead.json and prints a table. Targets (issue 3): gateway p50
overhead <= 2 ms; gateway throughput >= 0.9x direct at 64 clients.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER  # noqa: E402
from policy_server.engines.vllm import VLLMEngine, _free_port  # noqa: E402
from policy_server.tiny_model import build_tiny_model  # noqa: E402

JOB = "arn:aws:sagemaker:bench:job/gateway-overhead"
BODY = {
    "model": "default",
    "messages": [{"role": "user", "content": "Say something about mazes and words."}],
    "max_tokens": 8,
    "temperature": 1.0,
}


async def wait_healthy(url: str, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            try:
                if (await client.get(f"{url}/health", timeout=5)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.5)
    raise RuntimeError(f"{url} did not become healthy")


async def drive(url: str, *, direct: bool, clients: int, per_client: int) -> dict[str, float]:
    """`clients` concurrent loops of `per_client` sequential calls; latency of each call."""
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def one_client() -> None:
            for _ in range(per_client):
                body = dict(BODY)
                if direct:  # what the gateway itself asks of vLLM, so only the hop differs
                    body.update(model="policy", logprobs=True, return_token_ids=True)
                headers = {JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: uuid.uuid4().hex}
                start = time.perf_counter()
                response = await client.post("/v1/chat/completions", json=body, headers=headers)
                latencies.append(time.perf_counter() - start)
                response.raise_for_status()

        start = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        wall = time.perf_counter() - start
    latencies.sort()
    return {
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "requests_per_s": len(latencies) / wall,
    }


async def run(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="rftkit-bench-"))
    model_dir = build_tiny_model(work / "model", seed=0)
    vllm_port, gateway_port = _free_port(), _free_port()
    vllm_python = os.environ.get("RFTKIT_VLLM_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python"))
    engine = VLLMEngine(model_dir, python=vllm_python, port=vllm_port)
    env = dict(os.environ, VLLM_ALLOW_RUNTIME_LORA_UPDATING="1", VLLM_CPU_KVCACHE_SPACE="1")
    vllm = subprocess.Popen(
        engine.command(vllm_port),
        stdout=open(work / "vllm.log", "wb"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    gateway = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "handlers.cli",
            "serve",
            "--engine",
            "vllm",
            "--model",
            str(model_dir),
            "--vllm-url",
            f"http://127.0.0.1:{vllm_port}",
            "--port",
            str(gateway_port),
            "--open-job",
            JOB,
            "--log-level",
            "warning",
            "--max-calls-per-rollout",
            "1000000",
        ],
        stdout=open(work / "gateway.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    direct_url, gateway_url = f"http://127.0.0.1:{vllm_port}", f"http://127.0.0.1:{gateway_port}"
    try:
        await wait_healthy(direct_url)
        await wait_healthy(gateway_url)
        for url, direct in ((direct_url, True), (gateway_url, False)):  # warm-up both paths
            await drive(url, direct=direct, clients=4, per_client=5)
        rows = []
        for clients in args.clients:
            per_client = max(2, args.requests_per_client * 16 // max(clients, 16))
            rounds: dict[str, list[dict[str, float]]] = {"direct": [], "gateway": []}
            for _ in range(args.rounds):
                rounds["direct"].append(
                    await drive(direct_url, direct=True, clients=clients, per_client=per_client)
                )
                rounds["gateway"].append(
                    await drive(gateway_url, direct=False, clients=clients, per_client=per_client)
                )
            med = {
                path: {key: statistics.median(r[key] for r in results) for key in results[0]}
                for path, results in rounds.items()
            }
            rows.append(
                {
                    "clients": clients,
                    "calls_per_round": clients * per_client,
                    "direct": med["direct"],
                    "gateway": med["gateway"],
                    "p50_overhead_ms": med["gateway"]["p50_ms"] - med["direct"]["p50_ms"],
                    "p99_overhead_ms": med["gateway"]["p99_ms"] - med["direct"]["p99_ms"],
                    "throughput_ratio": med["gateway"]["requests_per_s"] / med["direct"]["requests_per_s"],
                }
            )
        return {"rounds": args.rounds, "max_tokens": BODY["max_tokens"], "rows": rows}
    finally:
        for process in (gateway, vllm):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in (gateway, vllm):
            process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests-per-client", type=int, default=20)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "gateway_overhead.json")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(
        f"{'clients':>7} {'direct p50':>10} {'gw p50':>8} {'+p50 ms':>8} {'+p99 ms':>8} "
        f"{'direct rps':>10} {'gw rps':>8} {'ratio':>6}"
    )
    for row in result["rows"]:
        print(
            f"{row['clients']:>7} {row['direct']['p50_ms']:>10.2f} {row['gateway']['p50_ms']:>8.2f} "
            f"{row['p50_overhead_ms']:>8.2f} {row['p99_overhead_ms']:>8.2f} "
            f"{row['direct']['requests_per_s']:>10.1f} {row['gateway']['requests_per_s']:>8.1f} "
            f"{row['throughput_ratio']:>6.2f}"
        )
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
