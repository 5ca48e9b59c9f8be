"""Benchmark: an adapter's cast to the dtype its replicas serve it in, an older tree's against this one.

Through Ray's object store an adapter travels cast to the replicas' dtype (``read_adapter(directory,
dtype)`` in ``policy_server/engines/adapter_files.py``, run before ``ray.put``; see
``bench/adapter_transfer.py``). This times that call of both trees alternately in one process, on
the 8B Llama LoRA shapes of ``bench/adapter_transfer.py``, and checks their bytes are equal. The
older tree is a git worktree of the commit to compare against:

    git worktree add --detach /tmp/cast-before <commit>
    nice -n 5 .venv/bin/python -m bench.adapter_cast --before /tmp/cast-before [--rank 16] [--repeats 9]

Results go to ``bench/results/adapter_cast.json``: medians, every sample, torch's thread count and
the 1-minute load average before and after.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

from bench.adapter_transfer import write_fake_adapter

ROOT = Path(__file__).resolve().parent.parent
MODULE = Path("policy_server/engines/adapter_files.py")


def load_tree(tree: Path, name: str) -> ModuleType:
    """``tree``'s adapter_files module, loaded from its file."""
    spec = importlib.util.spec_from_file_location(name, tree / MODULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def commit(tree: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(tree), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the older source tree")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/adapter_cast.json")
    args = parser.parse_args(argv)
    trees = {
        "before": load_tree(args.before, "adapter_files_before"),
        "after": load_tree(ROOT, "adapter_files"),
    }
    samples: dict[str, list[float]] = {side: [] for side in trees}
    with tempfile.TemporaryDirectory() as work:
        directory = Path(work) / "adapter"
        size = write_fake_adapter(directory, args.rank)
        outputs = {side: module.read_adapter(directory, args.dtype) for side, module in trees.items()}
        if outputs["before"] != outputs["after"]:
            raise SystemExit("the two trees cast the adapter to different bytes")
        load_before = os.getloadavg()
        for round_ in range(args.repeats):
            for side in sorted(trees, reverse=round_ % 2 == 1):  # the order flips every round
                started = time.perf_counter()
                trees[side].read_adapter(directory, args.dtype)
                samples[side].append(time.perf_counter() - started)
        load_after = os.getloadavg()
    medians = {side: statistics.median(values) for side, values in samples.items()}
    report = {
        "trees": {"before": commit(args.before), "after": commit(ROOT)},
        "rank": args.rank,
        "dtype": args.dtype,
        "float32_bytes": size,
        "torch_threads": torch.get_num_threads(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "median_s": medians,
        "after_over_before": medians["after"] / medians["before"],
        "samples_s": samples,
        "command": ".venv/bin/python -m bench.adapter_cast " + " ".join(argv),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"{size / 1e6:.0f} MB to {args.dtype}: before {medians['before']:.3f} s, "
        f"after {medians['after']:.3f} s ({report['after_over_before']:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
