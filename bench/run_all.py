"""Run every benchmark in bench/ one after another; each writes its own file under bench/results/.

make bench        # or: .venv/bin/python bench/run_all.py [NAME ...]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
BENCHMARKS = [
    "hf_engine",
    "gateway_cpu",
    "gateway_overhead",
    "merge_ratio",
    "soak",
    "fanout_capacity",
    "adapter_transfer",
    "ray_overhead",
    "fsdp_update",
]


def main(argv: list[str]) -> int:
    failed = []
    for name in argv or BENCHMARKS:
        print(f"== bench/{name}.py", flush=True)
        if subprocess.call([sys.executable, str(BENCH_DIR / f"{name}.py")]) != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
