"""Benchmark: hf engine throughput against sequential ``model.generate`` calls.

For 1, 8 and 32 concurrent requests (tool-carrying chat prompts of different lengths, sampled at
temperature 1), measures completion tokens per second through ``HFEngine.generate`` (all requests at
once), batch-invariant (the default) and not (``batch_invariant=False``), and through plain
``model.generate`` called once per request, one after another. Median of ``--repeats`` runs, the
three sides alternating within each repeat. Results go to ``bench/results/hf_engine.json``; a
table is printed.

    .venv/bin/python bench/hf_engine.py [--model DIR] [--max-tokens 64] [--repeats 3] [--threads N]

Without ``--model`` it builds the tiny model (``policy_server.models.tiny``) in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from policy_server.engines.base import GenerationRequest
from policy_server.engines.hf import HFEngine
from policy_server.models.tiny import build_tiny_model

RESULTS = Path(__file__).resolve().parent / "results" / "hf_engine.json"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "move",
            "description": "Move one step in the maze.",
            "parameters": {"type": "object", "properties": {"direction": {"type": "string"}}},
        },
    }
]


def make_requests(count: int, max_tokens: int) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            messages=[
                {"role": "system", "content": "Walk the maze to the goal."},
                {"role": "user", "content": f"Maze {index}: " + "#S..#.G# " * (1 + index % 7)},
            ],
            tools=TOOLS,
            max_tokens=max_tokens,
            temperature=1.0,
            seed=index,
        )
        for index in range(count)
    ]


async def engine_run(engine: HFEngine, requests: list[GenerationRequest]) -> tuple[int, float]:
    started = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(request) for request in requests))
    return sum(len(result.completion_token_ids) for result in results), time.perf_counter() - started


def sequential_run(model: Any, tokenizer: Any, requests: list[GenerationRequest]) -> tuple[int, float]:
    tokens = 0
    started = time.perf_counter()
    for request in requests:
        prompt = tokenizer.apply_chat_template(
            request.messages,
            tools=request.tools,
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )
        with torch.inference_mode():
            output = model.generate(
                **prompt,
                do_sample=True,
                temperature=request.temperature,
                top_p=request.top_p,
                max_new_tokens=request.max_tokens,
            )
        tokens += output.shape[1] - prompt["input_ids"].shape[1]
    return tokens, time.perf_counter() - started


async def measure(model_dir: Path, levels: list[int], max_tokens: int, repeats: int) -> list[dict[str, Any]]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    engine = HFEngine(model_dir, max_batch_size=max(levels))
    fast = HFEngine(model_dir, max_batch_size=max(levels), batch_invariant=False)
    await engine.start()
    await fast.start()
    rows = []
    try:
        await engine_run(engine, make_requests(2, max_tokens))  # warm-up
        await engine_run(fast, make_requests(2, max_tokens))
        sequential_run(model, tokenizer, make_requests(2, max_tokens))
        for level in levels:
            requests = make_requests(level, max_tokens)
            engine_rates, fast_rates, sequential_rates = [], [], []
            for _ in range(repeats):
                tokens, seconds = await engine_run(engine, requests)
                engine_rates.append(tokens / seconds)
                tokens, seconds = await engine_run(fast, requests)
                fast_rates.append(tokens / seconds)
                tokens, seconds = sequential_run(model, tokenizer, requests)
                sequential_rates.append(tokens / seconds)
            engine_rate, fast_rate, sequential_rate = (
                statistics.median(engine_rates),
                statistics.median(fast_rates),
                statistics.median(sequential_rates),
            )
            rows.append(
                {
                    "concurrency": level,
                    "engine_tokens_per_s": round(engine_rate, 1),
                    "not_invariant_tokens_per_s": round(fast_rate, 1),
                    "sequential_tokens_per_s": round(sequential_rate, 1),
                    "speedup": round(engine_rate / sequential_rate, 2),
                    "invariance_cost": round(engine_rate / fast_rate, 2),
                }
            )
    finally:
        await engine.close()
        await fast.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="model directory (default: build the tiny model)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--threads",
        type=int,
        help="torch intra-op threads (default: torch's); 1 is steadier on a busy machine",
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model or build_tiny_model(Path(scratch) / "tiny", seed=0)
        rows = asyncio.run(measure(model_dir, args.levels, args.max_tokens, args.repeats))
    report = {
        "benchmark": "hf engine throughput (batch-invariant and not) vs sequential model.generate",
        "model": str(args.model) if args.model else "tiny (build_tiny_model defaults)",
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "statistic": "median completion tokens per second",
        "torch_threads": torch.get_num_threads(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "torch": torch.__version__,
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"{'concurrent':>10} {'engine tok/s':>13} {'not invariant':>14} {'sequential tok/s':>17} "
        f"{'speedup':>8} {'invariant/not':>14}"
    )
    for row in rows:
        print(
            f"{row['concurrency']:>10} {row['engine_tokens_per_s']:>13.1f} "
            f"{row['not_invariant_tokens_per_s']:>14.1f} {row['sequential_tokens_per_s']:>17.1f} "
            f"{row['speedup']:>7.2f}x {row['invariance_cost']:>13.2f}x"
        )
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
