"""Benchmark: what the hf engine's decode step costs beyond the model's own forward pass.

Each decode step of ``HFEngine`` (``policy_server/engines/hf_decode.py``) is one forward pass of the
batch plus the loop's own work around it: masks and positions, the adapter switch, the batch-invariance
bookkeeping, sampling, host copies, stop checks. This times both inside the same steps of one run: the
step (``DecodeLoop._decode_step``) and the model's forward within it (forward hooks on the served
module), so the ratio compares the same batch on the same model with nothing else varying; a ratio of
1.0 means the loop costs nothing beyond its forward. Measured at 1, 8 and 64 concurrent calls, on the
base model and with a LoRA adapter served (what training always serves), only over steps whose batch
holds at least 90% of the most calls (with 64 calls on the tiny model only two steps hold all 64: rows
stop at random). Median over steps; ``--repeats`` rounds alternate the two settings.

    .venv/bin/python bench/decode_overhead.py [--model DIR] [--max-tokens 32] [--repeats 3]

Without ``--model`` it builds the tiny model in a temporary directory; ``--model "$(rft model smollm2
--cached)" --name smollm2`` measures SmolLM2. Results go to ``bench/results/decode_overhead[-NAME].json``
(or ``--out``). The engine measured is the one ``policy_server`` imports: ``PYTHONPATH=TREE python
bench/decode_overhead.py`` times an older checkout's engine with this file (what
``bench/decode_overhead_compare.py`` does, alternating an older tree and this one).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from bench.hf_engine import make_requests
from policy_server.engines.hf import HFEngine
from policy_server.models.tiny import build_tiny_model

RESULTS = Path(__file__).resolve().parent / "results"
LEVELS = (1, 8, 64)


class StepClock:
    """Wall time of each decode step and of the model forward passes inside it, with the batch size."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, float, float]] = []  # (rows, step seconds, forward seconds)
        self._forward_s = 0.0
        self._started = 0.0

    def forward_started(self, *_: Any) -> None:
        self._started = time.perf_counter()

    def forward_ended(self, *_: Any) -> None:
        self._forward_s += time.perf_counter() - self._started

    def timed_step(self, engine: HFEngine, step: Callable[[], None]) -> Callable[[], None]:
        def timed() -> None:
            rows = len(engine._batch.rows) if engine._batch is not None else 0
            self._forward_s = 0.0
            started = time.perf_counter()
            step()
            self.steps.append((rows, time.perf_counter() - started, self._forward_s))

        return timed


@contextmanager
def clocked(engine: HFEngine) -> Iterator[StepClock]:
    """Time ``engine``'s decode steps and the forward passes of its served module while inside."""
    clock = StepClock()
    model = engine._model
    hooks = [
        model.register_forward_pre_hook(clock.forward_started),
        model.register_forward_hook(clock.forward_ended),
    ]
    original = engine._decode_step
    engine._decode_step = clock.timed_step(engine, original)  # type: ignore[method-assign]
    try:
        yield clock
    finally:
        engine._decode_step = original  # type: ignore[method-assign]
        for hook in hooks:
            hook.remove()


def random_adapter(model_dir: Path, out: Path) -> Path:
    """A rank-8 LoRA adapter on the attention and MLP projections, weights drawn from a fixed seed."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    for name, parameter in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.02)
    peft_model.save_pretrained(out)
    return out


async def one_round(
    engine: HFEngine, level: int, version: int, max_tokens: int
) -> tuple[int, list[float], list[float]]:
    """The largest batch, and the ratios step/forward and forward seconds of the steps at 90% of it or
    more (calls join as their prompts are rendered and leave at a stop token, so few steps hold all)."""
    requests = [replace(request, adapter_version=version) for request in make_requests(level, max_tokens)]
    with clocked(engine) as clock:
        await asyncio.gather(*(engine.generate(request) for request in requests))
    largest = max(rows for rows, _, _ in clock.steps)
    full = [(step, forward) for rows, step, forward in clock.steps if rows >= 0.9 * largest and forward > 0]
    return largest, [step / forward for step, forward in full], [forward for _, forward in full]


async def measure(
    model_dir: Path, max_tokens: int, repeats: int, adapter: Path, levels: list[int]
) -> list[dict[str, Any]]:
    engine = HFEngine(model_dir, max_batch_size=max(LEVELS))
    await engine.start()
    await engine.load_adapter(1, str(adapter))
    rows = []
    try:
        await one_round(engine, 2, 1, max_tokens)  # warm-up
        for level in levels:
            largest: dict[int, int] = {0: 0, 1: 0}
            ratios: dict[int, list[float]] = {0: [], 1: []}
            forwards: dict[int, list[float]] = {0: [], 1: []}
            for _ in range(repeats):
                for version in (0, 1):
                    rows_seen, found, forward = await one_round(engine, level, version, max_tokens)
                    largest[version] = max(largest[version], rows_seen)
                    ratios[version] += found
                    forwards[version] += forward
            for version, label in ((0, "base"), (1, "adapter")):
                rows.append(
                    {
                        "concurrency": level,
                        "served": label,
                        "batch_rows": largest[version],
                        "steps": len(ratios[version]),
                        "forward_ms": round(1000 * statistics.median(forwards[version]), 3),
                        "step_over_forward": round(statistics.median(ratios[version]), 3),
                    }
                )
    finally:
        await engine.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="model directory (default: build the tiny model)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--levels", type=int, nargs="+", default=list(LEVELS), help="concurrent calls")
    parser.add_argument("--name", help="the model's name in the results (default: its directory's)")
    parser.add_argument(
        "--out", type=Path, help="the results file (default: bench/results/decode_overhead[-NAME].json)"
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    load_at_start = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model or build_tiny_model(Path(scratch) / "tiny", seed=0)
        adapter = random_adapter(model_dir, Path(scratch) / "adapter")
        rows = asyncio.run(measure(model_dir, args.max_tokens, args.repeats, adapter, args.levels))
    name = args.name or ("tiny" if args.model is None else args.model.name)
    print(f"hf engine decode step against its own forward pass ({name}, median over steps)")
    print("| calls | served | batch rows | steps | forward ms | step / forward |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['concurrency']} | {row['served']} | {row['batch_rows']} | {row['steps']} "
            f"| {row['forward_ms']} | {row['step_over_forward']} |"
        )
    RESULTS.mkdir(exist_ok=True)
    out = args.out or RESULTS / ("decode_overhead.json" if name == "tiny" else f"decode_overhead-{name}.json")
    report = {
        "command": "bench/decode_overhead.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "model": name,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "engine": str(Path(inspect.getfile(HFEngine)).parent),  # the source tree measured
        "load_average": {"start": load_at_start, "end": round(os.getloadavg()[0], 2)},  # 1-minute
        "rows": rows,
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
