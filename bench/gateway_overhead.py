"""What the policy gateway costs on top of vLLM: added latency, throughput, CPU per call.

Starts one vLLM server (from vLLM's own environment) and two `rft serve` gateways attached to it, one
with a single gateway worker (the trainer's process serves) and one with ``--workers`` worker
processes, all as separate processes, then drives the same chat request directly and through each
gateway from this process (aiohttp, one session per side) at 1, 16 and 64 concurrent clients.
Rounds alternate direct / 1 worker / N workers so machine noise hits all alike; the report gives
medians over rounds, each gateway's throughput as a ratio of direct's, and the CPU each side's
processes spent per call (the gateway's: its process and its workers; direct's: vLLM's).

Placement (``--placement``): ``split`` (the default) pins the gateways to the second half of this
machine's cores and vLLM's processes and this process (the clients) to the first half, as a
deployment has it: the gateway on host cores of its own, the replica's compute elsewhere (a GPU),
the agents elsewhere. The clients' cost is the same on both sides, so sharing vLLM's cores with them
slows direct and gateway calls alike. ``shared`` lets every process take any core. On a machine as
small as 2 cores, ``shared`` measures CPU contention more than the gateway: vLLM's CPU build
spin-waits (its worker and engine core poll a shared-memory queue with ``sched_yield`` for a second
after each message), and the spinning takes the core the gateway's event loop needs, so a loaded
gateway stalls for up to a second at a time (measured: its event loop lagged 0.4-1.5 s, while
vLLM's worker and engine core took 20 of the 26 core-seconds of a 13 s round).

    nice -n 10 .venv/bin/python bench/gateway_overhead.py [--rounds 5] [--workers 2] [--placement split]

Writes bench/results/gateway_overhead.json (``--out``) and prints a table. Targets: gateway p50
overhead <= 2 ms (issue 3); gateway throughput >= 0.95x direct at 64 clients (issue 12).
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
from typing import Any

import aiohttp
import httpx
import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER  # noqa: E402
from policy_server.engines import VLLMEngine, free_port  # noqa: E402
from policy_server.models.tiny import build_tiny_model  # noqa: E402

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


async def wait_serving(url: str, *, direct: bool, timeout_s: float = 600) -> None:
    """Until a chat call succeeds: a gateway answers /health before its job is open."""
    await wait_healthy(url, timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await drive(url, direct=direct, clients=1, per_client=1)
            return
        except aiohttp.ClientError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def drive(url: str, *, direct: bool, clients: int, per_client: int) -> dict[str, float]:
    """`clients` concurrent loops of `per_client` sequential calls; latency of each call."""
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=clients + 4)
    async with aiohttp.ClientSession(url, connector=connector) as session:

        async def one_client() -> None:
            for _ in range(per_client):
                body = dict(BODY)
                if direct:  # what the gateway itself asks of vLLM, so only the hop differs
                    body.update(model="policy", logprobs=True, return_token_ids=True)
                headers = {JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: uuid.uuid4().hex}
                start = time.perf_counter()
                async with session.post("/v1/chat/completions", json=body, headers=headers) as response:
                    await response.read()
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


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and all its descendants (gateway workers, vLLM's engine core)."""
    root = psutil.Process(pid)
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


async def measured(pid: int, url: str, *, direct: bool, clients: int, per_client: int) -> dict[str, float]:
    """One round of :func:`drive` plus the CPU the serving side's processes spent per call."""
    before = cpu_seconds(pid)
    result = await drive(url, direct=direct, clients=clients, per_client=per_client)
    result["cpu_ms_per_call"] = 1000 * (cpu_seconds(pid) - before) / (clients * per_client)
    return result


def gateway_command(model_dir: Path, vllm_port: int, port: int, workers: int) -> list[str]:
    return [
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
        str(port),
        "--gateway-workers",
        str(workers),
        "--open-job",
        JOB,
        "--log-level",
        "warning",
        "--max-calls-per-rollout",
        "1000000",
        "--max-open-rollouts",  # every call is a rollout of its own, and none is ever taken
        "1000000",
    ]


def core_sets(placement: str) -> tuple[set[int], set[int]]:
    """The cores for vLLM's processes and the clients, and the cores for the gateways."""
    cores = sorted(os.sched_getaffinity(0))
    if placement == "shared" or len(cores) < 2:
        return set(cores), set(cores)
    half = len(cores) // 2
    return set(cores[:half]), set(cores[half:])


async def run(args: argparse.Namespace) -> dict:
    vllm_cores, gateway_cores = core_sets(args.placement)
    work = Path(tempfile.mkdtemp(prefix="rftkit-bench-"))
    model_dir = build_tiny_model(work / "model", seed=0)
    vllm_port = free_port()
    vllm_python = os.environ.get("RFTKIT_VLLM_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python"))
    engine = VLLMEngine(model_dir, python=vllm_python, port=vllm_port)
    env = dict(os.environ, VLLM_ALLOW_RUNTIME_LORA_UPDATING="1", VLLM_CPU_KVCACHE_SPACE="1")
    # Children inherit this process's cores: vLLM and we (the clients) get one set, the gateways the other.
    os.sched_setaffinity(0, vllm_cores)
    vllm = subprocess.Popen(
        engine.command(vllm_port),
        stdout=open(work / "vllm.log", "wb"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    processes, sides = [vllm], {"direct": (vllm.pid, f"http://127.0.0.1:{vllm_port}", True)}
    try:
        await wait_healthy(sides["direct"][1])
        os.sched_setaffinity(0, gateway_cores)
        for workers in (1, args.workers):
            port = free_port()
            gateway = subprocess.Popen(
                gateway_command(model_dir, vllm_port, port, workers),
                stdout=open(work / f"gateway-{workers}.log", "wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            processes.append(gateway)
            sides[f"gateway_{workers}w"] = (gateway.pid, f"http://127.0.0.1:{port}", False)
        os.sched_setaffinity(0, vllm_cores)
        for _, url, direct in sides.values():
            await wait_serving(url, direct=direct)
            await drive(url, direct=direct, clients=4, per_client=5)  # warm-up every path
        rows = [await measure_clients(sides, clients, args) for clients in args.clients]
        # What the processes ended up on: vLLM's CPU worker binds its threads itself.
        vllm_tree = [psutil.Process(vllm.pid), *psutil.Process(vllm.pid).children(recursive=True)]
        placed = {f"{p.name()}[{p.pid}]": sorted(p.cpu_affinity() or []) for p in vllm_tree}
        settings = {
            "rounds": args.rounds,
            "max_tokens": BODY["max_tokens"],
            "workers": args.workers,
            "placement": args.placement,
            "vllm_cores": sorted(vllm_cores),
            "gateway_cores": sorted(gateway_cores),
            "vllm_process_cores": placed,
        }
        return {**settings, "rows": rows}
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            process.wait(timeout=60)


async def measure_clients(
    sides: dict[str, tuple[int, str, bool]], clients: int, args: argparse.Namespace
) -> dict:
    """Alternating rounds of every side at ``clients`` concurrent clients; medians and ratios."""
    per_client = max(2, args.requests_per_client * 16 // max(clients, 16))
    rounds: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for _ in range(args.rounds):
        for side, (pid, url, direct) in sides.items():
            rounds[side].append(
                await measured(pid, url, direct=direct, clients=clients, per_client=per_client)
            )
    med: dict[str, dict[str, Any]] = {
        side: {key: statistics.median(r[key] for r in results) for key in results[0]}
        for side, results in rounds.items()
    }
    for side, results in rounds.items():  # every round's throughput, to see the noise behind a median
        med[side]["requests_per_s_rounds"] = [round(r["requests_per_s"], 1) for r in results]
    row: dict = {"clients": clients, "calls_per_round": clients * per_client, **med}
    for side in sides:
        if side != "direct":
            row[f"{side}_p50_overhead_ms"] = med[side]["p50_ms"] - med["direct"]["p50_ms"]
            row[f"{side}_throughput_ratio"] = med[side]["requests_per_s"] / med["direct"]["requests_per_s"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests-per-client", type=int, default=40)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--workers", type=int, default=2, help="gateway workers of the second gateway")
    parser.add_argument(
        "--placement",
        choices=("split", "shared"),
        default="split",
        help="split: vLLM and clients on half the cores, gateways on the other half; shared: any core",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "gateway_overhead.json")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    sides = ["gateway_1w", f"gateway_{args.workers}w"]
    header = ("clients", "side", "p50 ms", "+p50 ms", "rps", "ratio", "cpu ms/call")
    print(" ".join(f"{name:>{width}}" for name, width in zip(header, (7, 12, 8, 8, 7, 6, 11), strict=True)))
    for row in result["rows"]:
        print(
            f"{row['clients']:>7} {'direct':>12} {row['direct']['p50_ms']:>8.2f} {'':>8} "
            f"{row['direct']['requests_per_s']:>7.1f} {'':>6} {row['direct']['cpu_ms_per_call']:>11.2f}"
        )
        for side in sides:
            print(
                f"{'':>7} {side:>12} {row[side]['p50_ms']:>8.2f} {row[f'{side}_p50_overhead_ms']:>8.2f} "
                f"{row[side]['requests_per_s']:>7.1f} {row[f'{side}_throughput_ratio']:>6.2f} "
                f"{row[side]['cpu_ms_per_call']:>11.2f}"
            )
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
