"""Benchmark: a vLLM CPU-build server's start and first call, as vLLM ships and as rftkit starts it.

Two comparisons (``--compare``), each vLLM's default against rftkit's setting:

- ``dynamo``: the CPU build runs the model uncompiled, but a few helpers (the sampler's rank count of
  the sampled token's logprob among others) carry ``torch.compile``, and inductor builds them when the
  first call arrives; rftkit starts the server with ``TORCHDYNAMO_DISABLE=1`` (eager).
- ``workers``: vLLM runs its worker in a third process of its own (API server, engine core, worker),
  each importing vLLM; rftkit starts the CPU build with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so the
  worker runs inside the engine core's process.

Each round starts one server per side, one after the other (the sides alternate from round to
round), and measures: seconds until the server is healthy, seconds for the first batch of
``--calls`` seeded calls sent at once, and the sampled tokens and logprobs, which must be equal
between the sides. Medians over ``--rounds``; the ratio is vLLM's default / rftkit's. Results go to
``bench/results/vllm_first_call.json`` (``dynamo``) or ``vllm_start_workers.json`` (``workers``).

    RFTKIT_VLLM_PYTHON=.venv-vllm/bin/python .venv/bin/python bench/vllm_first_call.py \
        [--compare dynamo|workers] [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from policy_server.engines.base import GenerationRequest
from policy_server.engines.vllm import VLLMEngine
from policy_server.engines.vllm_server import DYNAMO_DISABLE_ENV, UNIPROC_ENV
from policy_server.models.tiny import build_tiny_model

RESULTS = Path(__file__).resolve().parent / "results"
# Per comparison: the variable, its results file, and each side's value (vLLM's default first, as a
# user's own setting; None: unset, rftkit's setting applies).
COMPARISONS: dict[str, tuple[str, str, dict[str, str | None]]] = {
    "dynamo": (DYNAMO_DISABLE_ENV, "vllm_first_call.json", {"compiled": "0", "eager": None}),
    "workers": (UNIPROC_ENV, "vllm_start_workers.json", {"three processes": "1", "two processes": None}),
}


async def one_start(model_dir: Path, calls: int, max_tokens: int) -> dict[str, Any]:
    """Start a CPU-build server, send ``calls`` seeded calls at once, stop it."""
    engine = VLLMEngine(model_dir, dtype="float32", max_lora_rank=8, cpu_build=True)
    started = time.monotonic()
    await engine.start()
    healthy = time.monotonic() - started
    try:
        requests = [
            GenerationRequest(
                messages=[{"role": "user", "content": "walk " * (index + 1)}],
                max_tokens=max_tokens,
                seed=index,
                temperature=1.0,
            )
            for index in range(calls)
        ]
        sent = time.monotonic()
        results = await asyncio.gather(*(engine.generate(request) for request in requests))
        first_call = time.monotonic() - sent
    finally:
        await engine.close()
    sampled = [[result.completion_token_ids, result.completion_logprobs] for result in results]
    return {"start_s": healthy, "first_call_s": first_call, "sampled": sampled}


def run_side(name: str, value: str | None, model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One start with the side's value of the compared variable in this process's environment (the
    server's)."""
    variable = COMPARISONS[args.compare][0]
    if value is None:
        os.environ.pop(variable, None)
    else:
        os.environ[variable] = value
    print(f"{name}: starting vLLM", flush=True)
    return asyncio.run(one_start(model_dir, args.calls, args.max_tokens))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="model directory (default: the tiny Llama, built here)")
    parser.add_argument("--calls", type=int, default=8, help="calls in the first batch (default 8)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens each call samples (default 32)")
    parser.add_argument("--rounds", type=int, default=3, help="starts per side; medians kept (default 3)")
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="dynamo")
    parser.add_argument("--out", type=Path, help="results file (default: bench/results/, by comparison)")
    args = parser.parse_args(argv)
    _, file_name, sides = COMPARISONS[args.compare]
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model or build_tiny_model(Path(scratch) / "model", seed=0)
        for round_index in range(args.rounds):
            order = list(sides) if round_index % 2 == 0 else list(reversed(sides))
            for side in order:
                runs[side].append(run_side(side, sides[side], model_dir, args))
    default, rftkit = list(sides)
    reference = runs[rftkit][0]["sampled"]
    same = all(run["sampled"] == reference for side_runs in runs.values() for run in side_runs)
    results: dict[str, Any] = {
        "compare": args.compare,
        "model": str(args.model or "tiny llama (build_tiny_model, seed 0)"),
        "calls": args.calls,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "machine": {"cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "same_tokens_and_logprobs": same,
    }
    for side, side_runs in runs.items():
        results[side] = {
            key: {
                "median": statistics.median(run[key] for run in side_runs),
                "all": [run[key] for run in side_runs],
            }
            for key in ("start_s", "first_call_s")
        }
    results[f"ratio_{_key(default)}_over_{_key(rftkit)}"] = {
        key: results[default][key]["median"] / results[rftkit][key]["median"]
        for key in ("start_s", "first_call_s")
    }
    out = args.out or RESULTS / file_name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({key: value for key, value in results.items() if key != "machine"}, indent=2))
    return 0 if same else 1


def _key(side: str) -> str:
    return side.replace(" ", "_")


if __name__ == "__main__":
    raise SystemExit(main())
