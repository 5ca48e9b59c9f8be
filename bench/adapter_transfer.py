"""How fast an adapter version reaches every inference replica: Ray's object store vs a shared path.

``RayEngine.load_adapter`` with ``ray.adapter_transfer: object_store`` reads the adapter's files once
in the trainer, puts them into Ray's object store, and each replica fetches them, writes them to its
own temporary directory and loads from there; with ``shared_path`` each replica loads straight from
the directory the trainer wrote. This runs both through the real ``RayEngine`` and ``Replica`` actors
on a local cluster, timing ``load_adapter`` until every replica holds the version. The replicas'
engine here only reads the adapter's files (what peft's load does first) instead of applying them
to a model: the transfer is what differs between the modes, and a real 8B model would not fit.

Sizes: an 8B Llama's LoRA at r=16 on every projection of its 32 layers holds 41.9M parameters (each
layer: q and o 4096->4096, k and v 4096->1024, gate, up and down 4096<->14336), saved as float32 by
the learner: 168 MB. The smaller one is the same at r=1 (10 MB).

    PYTHONPATH=. .venv/bin/python bench/adapter_transfer.py [--replicas 2] [--repeats 7]

Caveat: on one machine a "shared path" is the local page cache; across nodes it is a network file
system (EFS, FSx), whose throughput this does not measure. The object store moves data between
nodes over Ray's own transfer, which this does not measure either (one node).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

from policy_server.engines.base import GenerationRequest, GenerationResult
from policy_server.engines.ray.engine import RayEngine

LLAMA_8B_LORA_PARAMS_PER_RANK = 32 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 14336))


class FileReadingEngine:
    """Loads an adapter by reading every file of it (bytes only, no model to apply them to)."""

    model_name = "file-reader"

    def __init__(self) -> None:
        self.bytes_read: dict[int, int] = {}

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        raise RuntimeError("the adapter-transfer benchmark's engine only loads adapters; it serves no calls")

    async def load_adapter(self, version: int, path: str) -> None:
        self.bytes_read[version] = sum(len(p.read_bytes()) for p in Path(path).iterdir() if p.is_file())

    async def unload_adapter(self, version: int) -> None:
        self.bytes_read.pop(version, None)


def write_fake_adapter(directory: Path, rank: int) -> int:
    """An adapter directory of the size an 8B model's LoRA at ``rank`` has (random float32 bytes)."""
    import os

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA"}))
    size = LLAMA_8B_LORA_PARAMS_PER_RANK * rank * 4
    (directory / "adapter_model.safetensors").write_bytes(os.urandom(size))
    return size


async def time_loads(engine: RayEngine, directory: Path, repeats: int, first_version: int) -> list[float]:
    seconds = []
    for repeat in range(repeats):
        version = first_version + repeat
        started = time.perf_counter()
        await engine.load_adapter(version, str(directory))
        seconds.append(time.perf_counter() - started)
        await engine.unload_adapter(version)
    return seconds


async def measure(replicas: int, repeats: int, rank: int, work: Path) -> dict[str, Any]:
    directory = work / f"r{rank}"
    size = write_fake_adapter(directory, rank)
    engines = {
        mode: RayEngine(
            FileReadingEngine, model_name="bench", replicas=replicas, num_cpus=0.5, adapter_transfer=mode
        )
        for mode in ("object_store", "shared_path")
    }
    for engine in engines.values():
        await engine.start()
    result: dict[str, Any] = {"rank": rank, "adapter_bytes": size}
    try:
        # Alternate the modes, one load each per round, so both see the same machine load.
        samples: dict[str, list[float]] = {mode: [] for mode in engines}
        for round_ in range(repeats):
            for mode, engine in engines.items():
                samples[mode] += await time_loads(engine, directory, 1, first_version=1 + round_)
        for mode, values in samples.items():
            result[mode] = {"median_s": statistics.median(values), "samples_s": values}
        result["object_store_over_shared_path"] = (
            result["object_store"]["median_s"] / result["shared_path"]["median_s"]
        )
    finally:
        for engine in engines.values():
            await engine.close()
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("bench/results/adapter_transfer.json"))
    args = parser.parse_args(argv)
    ray.init(num_cpus=max(2, args.replicas), include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as work:
            sizes = [asyncio.run(measure(args.replicas, args.repeats, rank, Path(work))) for rank in (1, 16)]
    finally:
        ray.shutdown()
    report = {
        "replicas": args.replicas,
        "repeats": args.repeats,
        "sizes": sizes,
        "command": "PYTHONPATH=. .venv/bin/python bench/adapter_transfer.py " + " ".join(argv),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for size in sizes:
        print(
            f"{size['adapter_bytes'] / 1e6:.0f} MB to {args.replicas} replicas: object store "
            f"{size['object_store']['median_s']:.3f} s, shared path {size['shared_path']['median_s']:.3f} s "
            f"(ratio {size['object_store_over_shared_path']:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
