"""Soak: 10,000 rollouts through the policy gateway with the process's memory sampled; it must stay flat.

The policy server is the real one (hf engine, the tiny model built offline, uvicorn on loopback). The
trainer's side runs as in `rft train`, in the same process through the Python API: it opens each
rollout and takes its trace. The agents are stubs (in-process httpx clients, ``--concurrency`` at a
time): each rollout makes ``--calls`` chat calls (each extends the previous answer, as a multi-turn
agent does), posts its reward and completes. RSS (``/proc/self/status``) is sampled every
``--sample-every`` rollouts; after the warm-up (the first ``--warmup`` rollouts: allocator pools,
caches, first batches) the spread (max - min) / min of the samples must be within 10%.

    .venv/bin/python bench/soak.py [--rollouts 10000] [--concurrency 32] [--calls 2] [--max-tokens 4]

Writes bench/results/soak.json and prints the verdict; exits 1 when memory is not flat.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from handlers.protocol import (  # noqa: E402
    COMPLETE_ROLLOUT_PATH,
    JOB_ARN_HEADER,
    TRAJECTORY_ID_HEADER,
    UPDATE_REWARD_PATH,
)
from policy_server import PolicyServer, ServerThread  # noqa: E402
from policy_server.engines.hf import HFEngine  # noqa: E402
from policy_server.models.tiny import build_tiny_model  # noqa: E402

JOB = "arn:aws:sagemaker:bench:job/soak"
FLAT_WITHIN = 0.10


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status (the soak needs Linux)")


async def stub_agent(client: httpx.AsyncClient, rollout_id: str, max_tokens: int, calls: int) -> None:
    """``calls`` chat calls, a reward and the completion report, as an agent on @rft_handler sends them."""
    headers = {JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: rollout_id}
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"Walk the maze {rollout_id[-3:]}."}]
    for _ in range(calls):
        body = {"model": "policy", "messages": messages, "max_tokens": max_tokens, "temperature": 1.0}
        response = await client.post("/v1/chat/completions", json=body, headers=headers)
        response.raise_for_status()
        messages += [response.json()["choices"][0]["message"], {"role": "user", "content": "Go on."}]
    report = {"JobArn": JOB, "TrajectoryId": rollout_id}
    (await client.post(UPDATE_REWARD_PATH, json={**report, "Rewards": [1.0]})).raise_for_status()
    (await client.post(COMPLETE_ROLLOUT_PATH, json={**report, "Status": "ready"})).raise_for_status()


async def soak(server: PolicyServer, url: str, args: argparse.Namespace) -> dict[str, Any]:
    samples: list[tuple[int, float]] = [(0, rss_mb())]
    failures: list[str] = []
    done = 0
    next_id = 0
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def worker() -> None:
            nonlocal done, next_id
            while next_id < args.rollouts:
                rollout_id = f"soak-{next_id:06d}"
                next_id += 1
                server.open_rollout(JOB, rollout_id)  # the trainer's side, as in `rft train`
                try:
                    await stub_agent(client, rollout_id, args.max_tokens, args.calls)
                except httpx.HTTPError as error:
                    failures.append(f"{rollout_id}: {type(error).__name__}: {error}")
                trace = server.take_trace(JOB, rollout_id)
                if len(trace.calls) != args.calls or trace.rewards != [1.0]:
                    failures.append(
                        f"{rollout_id}: trace with {len(trace.calls)} calls, rewards {trace.rewards}"
                    )
                done += 1
                if done % args.sample_every == 0:
                    samples.append((done, rss_mb()))

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        elapsed = time.monotonic() - started
    gc.collect()
    samples.append((done, rss_mb()))
    after_warmup = [mb for count, mb in samples if count >= args.warmup]
    low, high = min(after_warmup), max(after_warmup)
    counters = server.counters(JOB)
    return {
        "rollouts": done,
        "chat_calls": args.calls * done,
        "failures": len(failures),
        "first_failures": failures[:5],
        "seconds": round(elapsed, 1),
        "rollouts_per_s": round(done / elapsed, 1),
        "prompt_tokens": counters.prefill_tokens,
        "sampled_tokens": counters.sample_tokens,
        "rss_mb_start": round(samples[0][1], 1),
        "rss_mb_after_warmup": round(after_warmup[0], 1),
        "rss_mb_end": round(samples[-1][1], 1),
        "rss_mb_min_after_warmup": round(low, 1),
        "rss_mb_max_after_warmup": round(high, 1),
        "spread_after_warmup": round((high - low) / low, 4),
        "flat": (high - low) / low <= FLAT_WITHIN and not failures,
        "samples": [[count, round(mb, 1)] for count, mb in samples],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=32, help="stub agents playing at once")
    parser.add_argument("--max-tokens", type=int, default=4, help="max_tokens of every chat call")
    parser.add_argument("--calls", type=int, default=2, help="chat calls per rollout")
    parser.add_argument("--warmup", type=int, default=1_000, help="rollouts before memory must be flat")
    parser.add_argument("--sample-every", type=int, default=250, help="rollouts between RSS samples")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "soak.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "model", seed=0)
        server = PolicyServer(HFEngine(model, max_batch_size=64))
        with ServerThread(server) as thread:
            server.open_job(JOB, max_tokens=args.max_tokens, max_calls_per_rollout=args.calls)
            result = asyncio.run(soak(server, thread.url, args))
            server.close_job(JOB)
    result["command"] = "bench/soak.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result["settings"] = {
        "concurrency": args.concurrency,
        "calls_per_rollout": args.calls,
        "max_tokens": args.max_tokens,
        "warmup": args.warmup,
        "engine": "hf, tiny model (policy_server/models/tiny.py), max_batch_size 64",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    verdict = "flat" if result["flat"] else "NOT flat"
    print(
        f"{result['rollouts']} rollouts ({result['chat_calls']} chat calls, {result['failures']} failed) in "
        f"{result['seconds']} s ({result['rollouts_per_s']}/s); RSS {result['rss_mb_start']} MB at start, "
        f"{result['rss_mb_after_warmup']} MB after {args.warmup} rollouts, "
        f"{result['rss_mb_end']} MB at the end; "
        f"spread after warm-up {result['spread_after_warmup']:.1%}: {verdict} (limit {FLAT_WITHIN:.0%})"
    )
    return 0 if result["flat"] else 1


if __name__ == "__main__":
    sys.exit(main())
