"""How fast an adapter version reaches every inference replica: Ray's object store vs a shared path.

``RayEngine.load_adapter`` with ``ray.adapter_transfer: object_store`` reads the adapter's files once
in the trainer, puts them into Ray's object store, and each replica fetches them, writes them to its
own temporary directory and loads from there; with ``shared_path`` each replica loads straight from
the directory the trainer wrote. This runs both through the real ``RayEngine`` and ``Replica`` actors
on a local cluster, timing ``load_adapter`` until every replica holds the version. The replicas'
engine here only reads the adapter's files (what peft's load does first) instead of applying them
to a model: the transfer is what differs between the modes, and a real 8B model would not fit.

Through the object store, an adapter travels in the dtype its replicas serve it in
(``RayEngine(adapter_dtype=...)``, ``trainer/scale/ray_cluster.py: adapter_serving_dtype``): vLLM on
GPUs casts every LoRA to its ``--dtype``, so bfloat16 for a bfloat16 model; before that it travelled
as the learner's float32. Both run here through the same path (``object_store`` as float32, and
``object_store_bfloat16``: read, cast, put, fetched and written by every replica), next to
``shared_path``, alternating in one run.

Sizes: an 8B Llama's LoRA at r=16 on every projection of its 32 layers holds 41.9M parameters (each
layer: q and o 4096->4096, k and v 4096->1024, gate, up and down 4096<->14336), saved as float32 by
the learner: 168 MB. The smaller one is the same at r=1 (10 MB). The adapter is a real safetensors
file of random float32 LoRA matrices of those shapes, so the cast runs as it would on a real one.

    PYTHONPATH=. .venv/bin/python bench/adapter_transfer.py [--replicas 2] [--repeats 7]

Caveat: on one machine a "shared path" is the local page cache; across nodes it is a network file
system (EFS, FSx), whose throughput this does not measure. The object store moves data between
nodes over Ray's own transfer, which this does not measure either (one node).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

from policy_server.engines.adapter_files import read_adapter
from policy_server.engines.base import GenerationRequest, GenerationResult
from policy_server.engines.ray.engine import RayEngine

LLAMA_8B_PROJECTIONS = {  # module: (inputs, outputs) of an 8B Llama's projections, 32 layers of them
    "self_attn.q_proj": (4096, 4096),
    "self_attn.k_proj": (4096, 1024),
    "self_attn.v_proj": (4096, 1024),
    "self_attn.o_proj": (4096, 4096),
    "mlp.gate_proj": (4096, 14336),
    "mlp.up_proj": (4096, 14336),
    "mlp.down_proj": (14336, 4096),
}
REPLICA_CPUS = 0.5
# Modes measured: (adapter_transfer, the dtype adapters travel in through the object store).
MODES = {
    "object_store": ("object_store", None),
    "object_store_bfloat16": ("object_store", "bfloat16"),
    "shared_path": ("shared_path", None),
}


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
    """An adapter directory of an 8B Llama's LoRA shapes at ``rank`` (random float32 matrices);
    returns its weights' size in bytes."""
    import torch
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA"}))
    generator = torch.Generator().manual_seed(rank)
    tensors = {}
    for layer in range(32):
        for module, (inputs, outputs) in LLAMA_8B_PROJECTIONS.items():
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, inputs, generator=generator)
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(outputs, rank, generator=generator)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())


def time_read(directory: Path, dtype: str | None) -> float:
    """Seconds of what the object store's path does before ``ray.put``: read the files, cast them to
    ``dtype`` if set (timed alone, after the round's loads)."""
    started = time.perf_counter()
    read_adapter(directory, dtype)
    return time.perf_counter() - started


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
            FileReadingEngine,
            model_name="bench",
            replicas=replicas,
            num_cpus=REPLICA_CPUS,
            adapter_transfer=transfer,
            adapter_dtype=dtype,
        )
        for mode, (transfer, dtype) in MODES.items()
    }
    for engine in engines.values():
        await engine.start()
    result: dict[str, Any] = {"rank": rank, "adapter_bytes": size}
    try:
        # Alternate the modes, one load each per round, so both see the same machine load.
        samples: dict[str, list[float]] = {mode: [] for mode in engines}
        reads: dict[str, list[float]] = {mode: [] for mode in engines}  # object store modes only
        for round_ in range(repeats):
            for mode, engine in engines.items():
                samples[mode] += await time_loads(engine, directory, 1, first_version=1 + round_)
                if MODES[mode][0] == "object_store":
                    reads[mode].append(time_read(directory, MODES[mode][1]))
        for mode, values in samples.items():
            sent = read_adapter(directory, MODES[mode][1])["adapter_model.safetensors"]
            result[mode] = {
                "median_s": statistics.median(values),
                "weights_bytes": len(sent),
                "samples_s": values,
            }
            if reads[mode]:
                result[mode]["read_median_s"] = statistics.median(reads[mode])
        result["object_store_over_shared_path"] = (
            result["object_store"]["median_s"] / result["shared_path"]["median_s"]
        )
        result["bfloat16_over_float32"] = (
            result["object_store_bfloat16"]["median_s"] / result["object_store"]["median_s"]
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
    load_before = os.getloadavg()
    # Logical CPUs for every mode's replicas at once (they take turns loading).
    ray.init(
        num_cpus=max(2, math.ceil(len(MODES) * args.replicas * REPLICA_CPUS)),
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        with tempfile.TemporaryDirectory() as work:
            sizes = [asyncio.run(measure(args.replicas, args.repeats, rank, Path(work))) for rank in (1, 16)]
    finally:
        ray.shutdown()
    report = {
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
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
            f"{size['object_store']['median_s']:.3f} s, in bfloat16 "
            f"{size['object_store_bfloat16']['median_s']:.3f} s ({size['bfloat16_over_float32']:.2f}x), "
            f"shared path {size['shared_path']['median_s']:.3f} s "
            f"(object store / shared path {size['object_store_over_shared_path']:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
