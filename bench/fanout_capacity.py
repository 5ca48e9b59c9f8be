"""How many rollouts per second the trainer's fan-out sustains when agents and engine cost nothing.

Stub agents answer ``{"reward": 1.0}`` at once (a raw ASGI app on rftkit's one serving helper,
``handlers.serving.ServingThread``), each in its own process so the fan-out's process is measured
alone; they never call the model, so no engine is involved. This process plays rounds of rollouts
through :class:`trainer.rollouts.fanout.Fanout` (the trainer's wire payloads, its concurrency limit, target
choice, deadline and answer parsing) and reports the median rollouts per second over the rounds, and
the fan-out's own CPU seconds per rollout (this process's CPU time / rollouts), which bounds what
one core of orchestration can sustain whatever the agents cost.

Rounds alternate with a shared-pool fan-out, the one before this bench: every rollout's request
through one httpx client whose pool holds ``max_concurrent`` connections. httpcore scans the whole
pool and its queue on every request, which made that pool the fan-out's main cost; the ratio of the
two medians is the fix's gain, measured in one run.

    .venv/bin/python bench/fanout_capacity.py [--rounds 5] [--rollouts 1000] [--agents 1]

Writes bench/results/fanout_capacity.json and prints the figures. Target (issue 12): >= 200
rollouts/s on 2 cores, so orchestration is never the bottleneck.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from trainer.rollouts.fanout import Fanout, RolloutRequest  # noqa: E402

JOB = "arn:aws:sagemaker:bench:job/fanout-capacity"
ANSWER = b'{"reward": 1.0}'
# A typical dataset row: a short task with a little structure.
ROW = {"task": "Walk the maze from S to G.", "grid": ["S..#", ".#..", "...G"], "max_turns": 12}


async def stub_agent(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
    """Read the whole request, answer a reward of 1 at once."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": ANSWER})


def serve_stub() -> None:
    """Child process: serve the stub agent, print its URL, run until stdin closes."""
    from handlers.serving import ServingThread

    with ServingThread(stub_agent, name="stub agent") as thread:
        print(thread.url, flush=True)
        sys.stdin.read()


class SharedPoolFanout(Fanout):
    """The fan-out as it was: one client, one pool of ``max_concurrent`` connections for all rollouts."""

    def __init__(self, targets: list[str], *, max_concurrent: int, rollout_timeout_s: float) -> None:
        super().__init__(targets, max_concurrent=max_concurrent, rollout_timeout_s=rollout_timeout_s)
        limits = httpx.Limits(max_connections=max_concurrent, max_keepalive_connections=max_concurrent)
        self._shared = httpx.AsyncClient(timeout=None, limits=limits)
        self._all_http.append(self._shared)

    def _http_client(self) -> httpx.AsyncClient:
        self._idle_http.clear()  # the per-rollout clients' free list is not used here
        return self._shared


def start_agents(count: int) -> tuple[list[subprocess.Popen[str]], list[str]]:
    processes, urls = [], []
    for _ in range(count):
        process = subprocess.Popen(
            [sys.executable, __file__, "--serve-stub"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError(f"stub agent did not start (exit code {process.poll()})")
        processes.append(process)
        urls.append(url)
    return processes, urls


def requests_for(count: int, round_index: int) -> list[RolloutRequest]:
    return [
        RolloutRequest(
            row=ROW,
            rollout_id=f"r{round_index}-{index}",
            group_index=index // 8,
            job_arn=JOB,
            endpoint="http://127.0.0.1:1/v1",
        )
        for index in range(count)
    ]


async def play_round(fanout: Fanout, requests: list[RolloutRequest]) -> dict[str, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    outcomes = await fanout.run(requests)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    failed = [outcome for outcome in outcomes if not outcome.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} rollouts failed, first: {failed[0].cause} {failed[0].error}")
    return {"rollouts_per_s": len(requests) / wall, "cpu_ms_per_rollout": 1000 * cpu / len(requests)}


async def measure(
    urls: list[str], rounds: int, rollouts: int, concurrency: int
) -> dict[str, list[dict[str, float]]]:
    """Rounds of both fan-outs, alternating, each warmed up first."""
    variants = {"per_rollout_clients": Fanout, "shared_pool": SharedPoolFanout}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    fanouts = {
        name: kind(urls, max_concurrent=concurrency, rollout_timeout_s=60) for name, kind in variants.items()
    }
    try:
        for fanout in fanouts.values():
            await play_round(fanout, requests_for(min(rollouts, 200), -1))  # warm connections
        for index in range(rounds):
            for name, fanout in fanouts.items():
                results[name].append(await play_round(fanout, requests_for(rollouts, index)))
    finally:
        for fanout in fanouts.values():
            await fanout.aclose()
    return results


def summary(results: list[dict[str, float]]) -> dict[str, Any]:
    rates = [result["rollouts_per_s"] for result in results]
    cpu = [result["cpu_ms_per_rollout"] for result in results]
    return {
        "rollouts_per_s": {"median": statistics.median(rates), "rounds": rates},
        "fanout_cpu_ms_per_rollout": {"median": statistics.median(cpu), "rounds": cpu},
        "one_core_bound_rollouts_per_s": 1000 / statistics.median(cpu),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rollouts", type=int, default=1000, help="rollouts per round")
    parser.add_argument("--agents", type=int, default=1, help="stub agent processes (targets)")
    parser.add_argument("--concurrency", type=int, default=64, help="max_concurrent_rollouts")
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "results" / "fanout_capacity.json")
    parser.add_argument("--serve-stub", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_stub:
        serve_stub()
        return 0
    processes, urls = start_agents(args.agents)
    try:
        results = asyncio.run(measure(urls, args.rounds, args.rollouts, args.concurrency))
    finally:
        for process in processes:
            assert process.stdin is not None
            process.stdin.close()
            process.wait(30)
    after, before = summary(results["per_rollout_clients"]), summary(results["shared_pool"])
    rate_after, rate_before = after["rollouts_per_s"]["median"], before["rollouts_per_s"]["median"]
    report = {
        "command": f"bench/fanout_capacity.py --rounds {args.rounds} --rollouts {args.rollouts} "
        f"--agents {args.agents} --concurrency {args.concurrency}",
        "cpu_count": os.cpu_count(),
        "fanout": after,
        "shared_pool_before": before,
        "speedup": rate_after / rate_before,
        "target_rollouts_per_s": 200,
        "meets_target": rate_after >= 200,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"fan-out: {rate_after:.0f} rollouts/s (median of {args.rounds} rounds of {args.rollouts}), "
        f"{after['fanout_cpu_ms_per_rollout']['median']:.2f} ms fan-out CPU per rollout (one core: "
        f"{after['one_core_bound_rollouts_per_s']:.0f}/s); shared pool before: {rate_before:.0f}/s "
        f"({report['speedup']:.1f}x); target >= 200/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
