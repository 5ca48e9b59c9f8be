"""Benchmark: the hf engine's step against its forward, an older engine and this one side by side.

Runs ``bench/decode_overhead.py`` (this checkout's file) alternately on the engine of an older
source tree and on this checkout's, ``--rounds`` times each (the order flips every round so a drift
in the machine's load falls on both), each run in its own process with ``PYTHONPATH`` set to the
tree. The older tree is a git worktree of the commit to compare against:

    git worktree add --detach /tmp/engine-before <commit>
    nice -n 5 .venv/bin/python -m bench.decode_overhead_compare --before /tmp/engine-before \\
        --rounds 2 -- --max-tokens 32 --threads 2

Arguments after ``--`` go to ``decode_overhead.py`` (``--model DIR --name NAME`` for another model).
Per setting it reports the median over rounds of each run's median step/forward ratio and forward
time, and the 1-minute load average at each run's start and end; results go to
``bench/results/decode_overhead_compare[-NAME].json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def commit(tree: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def one_run(tree: Path, bench_args: list[str], scratch: Path) -> dict[str, Any]:
    """One ``decode_overhead.py`` run (one repeat) on ``tree``'s engine; its results file's content."""
    out = scratch / "run.json"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, str(ROOT / "bench" / "decode_overhead.py"), *bench_args]
    subprocess.run([*command, "--repeats", "1", "--out", str(out)], env=env, check=True)
    report: dict[str, Any] = json.loads(out.read_text())
    if Path(report["engine"]).resolve() != (tree / "policy_server" / "engines").resolve():
        raise RuntimeError(f"the run measured the engine in {report['engine']}, not {tree}'s")
    return report


def summary(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per (calls, served): each side's median over rounds of ratio and forward ms, and its loads."""
    table = []
    for index, row in enumerate(runs["after"][0]["rows"]):
        entry: dict[str, Any] = {"concurrency": row["concurrency"], "served": row["served"]}
        for side, reports in runs.items():
            rows = [report["rows"][index] for report in reports]
            entry[side] = {
                "step_over_forward": round(statistics.median(r["step_over_forward"] for r in rows), 3),
                "forward_ms": round(statistics.median(r["forward_ms"] for r in rows), 3),
                "steps": sum(r["steps"] for r in rows),
                "load_average": [report["load_average"] for report in reports],
            }
        table.append(entry)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="source tree of the older engine")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("bench_args", nargs="*", help="arguments for decode_overhead.py (after --)")
    args = parser.parse_args(argv)
    trees = {"before": args.before.resolve(), "after": ROOT}
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(args.rounds):
            order = ("before", "after") if round_index % 2 == 0 else ("after", "before")
            for side in order:
                runs[side].append(one_run(trees[side], args.bench_args, Path(scratch)))
    name = runs["after"][0]["model"]
    table = summary(runs)
    print(f"hf engine step / forward, before ({commit(trees['before'])}) and after ({commit(ROOT)}), {name}")
    print(
        "| calls | served | before: forward ms | before: step / forward "
        "| after: forward ms | after: step / forward |"
    )
    print("|---|---|---|---|---|---|")
    for entry in table:
        before, after = entry["before"], entry["after"]
        print(
            f"| {entry['concurrency']} | {entry['served']} | {before['forward_ms']} | "
            f"{before['step_over_forward']} | {after['forward_ms']} | {after['step_over_forward']} |"
        )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / (
        "decode_overhead_compare.json" if name == "tiny" else f"decode_overhead_compare-{name}.json"
    )
    report = {
        "command": "bench/decode_overhead_compare.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "before": commit(trees["before"]),
        "after": commit(ROOT),
        "rounds": args.rounds,
        "rows": table,
        "runs": runs,
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
