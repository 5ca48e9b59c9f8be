"""Benchmark: sampling with a LoRA adapter on vLLM's CPU build, as rftkit starts it and as vLLM ships.

Three servers of the same model, one after another in one run, each with a rank-16 adapter on every
projection loaded:

- ``vllm_ops_rank64``: vLLM's own CPU LoRA ops, ``--max-lora-rank 64`` (rftkit's earlier default);
- ``vllm_ops_rank16``: vLLM's own ops, the adapter's rank;
- ``rftkit_ops_rank16``: rftkit's ops (``vllm_site/rftkit_lora_ops.py``), the adapter's rank: how
  the trainer starts vLLM on a CPU.

All three never chunk a prefill (vLLM's CPU build crashes on a chunked seeded one). Each measures
``--calls`` maze-shaped chat calls sent at once, twice: prefill (one token each) and decode
(``--max-tokens`` each, ``ignore_eos``), with the adapter and with the base model, as the median of
``--rounds``. Ratios are against ``vllm_ops_rank64``. Results go to ``bench/results/vllm_cpu_lora.json``.

    RFTKIT_VLLM_PYTHON=.venv-vllm/bin/python .venv/bin/python bench/vllm_cpu_lora.py [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from policy_server.engines.vllm import VLLMEngine
from policy_server.models import cached_smollm2
from trainer.sft import PROJECTION_MODULES

RESULTS = Path(__file__).resolve().parent / "results" / "vllm_cpu_lora.json"
SIDES = {
    "vllm_ops_rank64": {"max_lora_rank": 64, "cpu_build": False},
    "vllm_ops_rank16": {"max_lora_rank": 16, "cpu_build": False},
    "rftkit_ops_rank16": {"max_lora_rank": 16, "cpu_build": True},
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "move",
            "description": "Move one cell in the maze.",
            "parameters": {
                "type": "object",
                "properties": {"direction": {"type": "string", "enum": ["up", "down", "left", "right"]}},
                "required": ["direction"],
            },
        },
    }
]


def write_adapter(model_dir: Path, out: Path) -> None:
    """A rank-16 adapter on every projection, B random (a trained one's cost, not a zero's)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = LoraConfig(r=16, lora_alpha=32, target_modules=list(PROJECTION_MODULES), init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(out)


def _body(model: str, index: int, max_tokens: int) -> dict[str, Any]:
    observation = f"Maze 5x5. Goal: {index % 4 + 1} down, {index % 3} right. Moves left: {index % 9 + 4}."
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": "Walk the maze to the goal."},
            {"role": "user", "content": observation + " Around: UpWall DownCloser LeftFarther RightCloser."},
        ],
        "tools": TOOLS,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 1.0,
        "seed": index,
    }


async def _round(base_url: str, model: str, calls: int, max_tokens: int, first: int) -> float:
    """Seconds for ``calls`` calls sent at once."""
    async with httpx.AsyncClient(base_url=base_url, timeout=900) as client:
        started = time.monotonic()
        replies = await asyncio.gather(
            *(
                client.post("/v1/chat/completions", json=_body(model, first + i, max_tokens))
                for i in range(calls)
            )
        )
        seconds = time.monotonic() - started
    for reply in replies:
        reply.raise_for_status()
    return seconds


async def measure_side(
    model_dir: Path, adapter: Path, settings: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """Start one server, load the adapter, time prefill and decode with it and without it."""
    # A CPU-build engine adds the flag itself.
    extra = [] if settings["cpu_build"] else ["--no-enable-chunked-prefill"]
    engine = VLLMEngine(model_dir, dtype="float32", max_loras=2, extra_args=extra, **settings)
    await engine.start()
    try:
        await engine.load_adapter(1, str(adapter))
        figures: dict[str, Any] = {}
        for label, model in (("adapter", engine.adapter_name(1)), ("base", engine.model_name)):
            await _round(engine.base_url, model, args.calls, 2, 10_000)  # warm-up
            prefill = [
                await _round(engine.base_url, model, args.calls, 1, r * 1000) for r in range(args.rounds)
            ]
            decode = [
                await _round(engine.base_url, model, args.calls, args.max_tokens, 500 + r * 1000)
                for r in range(args.rounds)
            ]
            figures[label] = {
                "prefill_s": statistics.median(prefill),
                "decode_s": statistics.median(decode),
                "sampled_tokens_per_s": args.calls * args.max_tokens / statistics.median(decode),
            }
        return figures
    finally:
        await engine.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="model directory (default: SmolLM2-135M-Instruct, cached)")
    parser.add_argument("--calls", type=int, default=32, help="calls sent at once (default 32)")
    parser.add_argument(
        "--max-tokens", type=int, default=32, help="tokens each decode call samples (default 32)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds per figure; the median is kept (default 3)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    model_dir = args.model or cached_smollm2()
    results: dict[str, Any] = {"model": str(model_dir), "calls": args.calls, "max_tokens": args.max_tokens}
    with tempfile.TemporaryDirectory() as scratch:
        adapter = Path(scratch) / "adapter"
        write_adapter(model_dir, adapter)
        for side, settings in SIDES.items():
            print(f"{side}: starting vLLM", flush=True)
            results[side] = asyncio.run(measure_side(model_dir, adapter, settings, args))
    reference = results["vllm_ops_rank64"]["adapter"]
    print(
        f"\n{args.calls} calls at once | prefill s | decode s | sampled tok/s | vs rank 64 | base model tok/s"
    )
    for side in SIDES:
        adapter_figures, base = results[side]["adapter"], results[side]["base"]
        ratio = reference["decode_s"] / adapter_figures["decode_s"]
        results[side]["decode_speedup_vs_vllm_ops_rank64"] = ratio
        tokens_per_s = adapter_figures["sampled_tokens_per_s"]
        base_tokens_per_s = base["sampled_tokens_per_s"]
        print(
            f"{side:18} | {adapter_figures['prefill_s']:9.2f} | {adapter_figures['decode_s']:8.2f} | "
            f"{tokens_per_s:13.1f} | {ratio:9.2f}x | {base_tokens_per_s:.1f}"
        )
    results["machine"] = {"platform": platform.platform(), "processor": platform.processor()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
