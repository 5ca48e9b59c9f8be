"""Benchmark: a vLLM CPU-build server's start and first call, as vLLM ships and as rftkit starts it.

Three comparisons (``--compare``), each vLLM's default (or rftkit's earlier code) against rftkit's now:

- ``dynamo``: the CPU build runs the model uncompiled, but a few helpers (the sampler's rank count of
  the sampled token's logprob among others) carry ``torch.compile``, and inductor builds them when the
  first call arrives; rftkit starts the server with ``TORCHDYNAMO_DISABLE=1`` (eager).
- ``workers``: vLLM runs its worker in a third process of its own (API server, engine core, worker),
  each importing vLLM; rftkit starts the CPU build with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so the
  worker runs inside the engine core's process.
- ``site``: ``vllm_site/sitecustomize.py``, which Python imports in every process of the server, as of
  git revision ``--site-from`` against this checkout's (the site folder of each side is handed to the
  server; rftkit's LoRA ops come with both).

Each round starts one server per side, one after the other (the sides alternate from round to
round), and measures: seconds until the server is healthy, the CPU-seconds each of its processes had
used by then, seconds for the first batch of ``--calls`` seeded calls sent at once, and the sampled
tokens and logprobs, which must be equal between the sides. Medians over ``--rounds``; the ratio is
the first side's over rftkit's now. Results go to ``bench/results/vllm_first_call.json``
(``dynamo``), ``vllm_start_workers.json`` (``workers``) or ``vllm_start_site.json`` (``site``).

    RFTKIT_VLLM_PYTHON=.venv-vllm/bin/python .venv/bin/python bench/vllm_first_call.py \
        [--compare dynamo|workers|site] [--site-from REV] [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from policy_server.engines import vllm_server
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
    "site": ("", "vllm_start_site.json", {"site from revision": "old", "site now": None}),
}
SITE_DIR = vllm_server.VLLM_SITE_DIR
REPO = Path(__file__).resolve().parent.parent


def old_site(revision: str, into: Path) -> Path:
    """The vllm_site folder as of git ``revision``, written to ``into``."""
    into.mkdir(parents=True)
    for path in SITE_DIR.glob("*.py"):
        relative = path.relative_to(REPO).as_posix()
        shown = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{revision}:{relative}"],
            capture_output=True,
            text=True,
            check=True,
        )
        (into / path.name).write_text(shown.stdout)
    return into


def process_cpu_s(root: int) -> dict[str, float]:
    """CPU-seconds (user + system) of each process under ``root``, by its command (first 60 characters)."""
    stats: dict[int, tuple[int, float, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_text().replace("\0", " ").strip()
        except OSError:  # the process ended while being read
            continue
        ticks = int(fields[11]) + int(fields[12])
        stats[int(entry.name)] = (int(fields[1]), ticks / os.sysconf("SC_CLK_TCK"), command[:60])
    tree, grown = {root}, True
    while grown:
        grown = False
        for pid, (parent, _, _) in stats.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grown = True
    return {f"{stats[pid][2]} [{pid}]": stats[pid][1] for pid in sorted(tree - {root}) if pid in stats}


async def one_start(model_dir: Path, calls: int, max_tokens: int) -> dict[str, Any]:
    """Start a CPU-build server, send ``calls`` seeded calls at once, stop it."""
    engine = VLLMEngine(model_dir, dtype="float32", max_lora_rank=8, cpu_build=True)
    started = time.monotonic()
    await engine.start()
    healthy = time.monotonic() - started
    cpu = process_cpu_s(os.getpid())
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
    return {
        "start_s": healthy,
        "start_cpu_s": sum(cpu.values()),
        "processes_cpu_s": cpu,
        "first_call_s": first_call,
        "sampled": sampled,
    }


def run_side(name: str, value: str | None, model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One start with the side's value of the compared variable in this process's environment (the
    server's)."""
    variable = COMPARISONS[args.compare][0]
    if args.compare == "site":
        vllm_server.VLLM_SITE_DIR = args.old_site if value == "old" else SITE_DIR
    elif value is None:
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
    parser.add_argument(
        "--site-from",
        default="b3842c8^",
        help="--compare site: the old side's git revision (default b3842c8^)",
    )
    parser.add_argument("--out", type=Path, help="results file (default: bench/results/, by comparison)")
    args = parser.parse_args(argv)
    _, file_name, sides = COMPARISONS[args.compare]
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model or build_tiny_model(Path(scratch) / "model", seed=0)
        if args.compare == "site":
            args.old_site = old_site(args.site_from, Path(scratch) / "old-site")
            sides = {f"site from {args.site_from}": "old", "site now": None}
            runs = {side: [] for side in sides}
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
            for key in ("start_s", "start_cpu_s", "first_call_s")
        }
        results[side]["processes_cpu_s"] = [run["processes_cpu_s"] for run in side_runs]
    results[f"ratio_{_key(default)}_over_{_key(rftkit)}"] = {
        key: results[default][key]["median"] / results[rftkit][key]["median"]
        for key in ("start_s", "start_cpu_s", "first_call_s")
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
