"""A few GRPO steps of the maze on one device, measured: what ``bench/device_check.sh`` runs on a GPU.

    python bench/device_check.py --device cuda --model DIR --vllm-python .venv-vllm-gpu/bin/python
    python bench/device_check.py --device cpu          # the same path on the tiny model (tests)

On ``cuda`` the learner and vLLM share GPU 0 (vLLM at ``--vllm-memory`` of it, asleep during each
update), both in bfloat16; on ``cpu`` the hf engine and the learner run in float32 in this process.
A short supervised warm start (``rft sft``, on the CPU) teaches the maze's tool call first, so the
groups have reward variance and updates happen. Writes ``--out`` (JSON): step time split into
rollouts / update / adapter load, sampled tokens per second, peak memory per process, and the
sampler-vs-learner logprob mismatch (k3 KL per token, measured on each batch before its update).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from trainer.config import TrainConfig  # noqa: E402
from trainer.sft.common import PROJECTION_MODULES  # noqa: E402

LORA_R = 16


def cuda_peak_memory_gb() -> float | None:
    """This process's peak of memory reserved by torch's CUDA allocator, in GB (None without CUDA).

    Read in the process itself: ``nvidia-smi`` inside a container often does not see the processes
    using the GPU, and the allocator's figure is what the memory plan estimates."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return max(torch.cuda.max_memory_reserved(index) for index in range(torch.cuda.device_count())) / 1e9


def build_config(
    args: argparse.Namespace, model_dir: Path, adapter: Path | None, train_file: Path, agent: str
) -> TrainConfig:
    """The short GRPO run: a shared GPU with vLLM asleep during updates, or the hf engine on the CPU."""
    cuda = args.device == "cuda"
    engine = "vllm" if cuda else "hf"
    fields: dict[str, Any] = {
        "model": str(model_dir),
        "engine": engine,
        "init_adapter": str(adapter) if adapter else None,
        "lora": {"r": LORA_R, "lora_alpha": 2.0 * LORA_R, "target_modules": args.target_modules},
        "learner": {"device": "cuda:0" if cuda else "cpu", "gradient_checkpointing": cuda},
        "hf": {"device": "cpu", "dtype": "float32"} if not cuda else {},
        "train_file": str(train_file),
        "agents": [agent],
        "num_generations": args.generations,
        "rows_per_step": args.rows,
        "max_steps": args.steps,
        "learning_rate": 1e-4,
        "loss_type": "dapo",
        "max_completion_length": 64,
        "max_calls_per_rollout": 32,
        "rollout_timeout_s": args.stage_timeout_s,
        "eval_on_start": False,
        "eval_on_end": False,
        "save_steps": args.steps,
        "save_total_limit": 1,
        "output_dir": str(args.run_dir / "grpo"),
        "seed": args.seed,
    }
    if cuda:
        fields["vllm"] = {
            "python": args.vllm_python,
            "dtype": "bfloat16",
            "gpu_memory_utilization": args.vllm_memory,
            "max_model_len": 4096,
            "enable_sleep_mode": True,
            "max_lora_rank": LORA_R,
            "startup_timeout_s": args.stage_timeout_s,
        }
    return TrainConfig.model_validate(fields)


def summarise(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-step timings, throughput and mismatch, with their medians."""
    rollouts = [step["time_s"]["rollout"] for step in history]
    updates = [step["time_s"]["update"] for step in history]
    loads = [step["time_s"]["adapter_load"] for step in history]
    sampled = [step["tokens"]["sample"] for step in history]
    per_s = [tokens / seconds for tokens, seconds in zip(sampled, rollouts, strict=True) if seconds > 0]
    applied = [step for step in history if step["update"].get("applied")]
    mismatch = [step["update"]["mismatch_kl"] for step in applied]
    peaks = [step["update"]["memory_peak_gb"] for step in applied if "memory_peak_gb" in step["update"]]
    return {
        "step_time_s": {
            "rollouts": rollouts,
            "update": updates,
            "adapter_load": loads,
            "median": {
                "rollouts": statistics.median(rollouts),
                "update": statistics.median(updates),
                "adapter_load": statistics.median(loads),
            },
        },
        "sampled_tokens": sampled,
        "sampled_tokens_per_s": {"per_step": per_s, "median": statistics.median(per_s) if per_s else None},
        "updates_applied": len(applied),
        "logprob_mismatch_kl": {"per_update": mismatch, "max": max(mismatch) if mismatch else None},
        "learner_memory_peak_gb": max(peaks) if peaks else None,
    }


def warm_start(model_dir: Path, out_dir: Path, args: argparse.Namespace) -> Path:
    from agents.maze.demonstrations import maze_demonstrations
    from trainer.sft.text import run_sft

    result = run_sft(
        model_dir,
        maze_demonstrations(64, noise=0.3, seed=args.seed),
        out_dir,
        steps=args.sft_steps,
        learning_rate=2e-3,
        batch_size=8,
        lora_r=LORA_R,
        lora_alpha=2.0 * LORA_R,
        target_modules=args.target_modules,
        seed=args.seed,
    )
    return result.adapter_dir


def _maze(args: argparse.Namespace, model_dir: Path) -> tuple[Path, Path | None]:
    """The maze's training rows, and a warm-start adapter on its demonstrations (the CPU runs sft)."""
    from agents.maze.dataset import TRAIN_FILE, write_dataset

    data_dir = args.run_dir / "data"
    write_dataset(data_dir, 64)
    adapter = warm_start(model_dir, args.run_dir / "sft-adapter", args) if args.sft_steps else None
    return data_dir / TRAIN_FILE, adapter


def _agent(args: argparse.Namespace) -> contextlib.AbstractContextManager[str]:
    if args.agent:
        return contextlib.nullcontext(args.agent)
    from agents.maze.demo.agent_process import serve_agent

    return serve_agent()


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Model, warm start, agent, GRPO steps; returns what is written to ``args.out``."""
    from agents.maze.demo.model import maze_corpus
    from agents.maze.demo.plans import TINY_TARGET_MODULES
    from trainer.loop import train
    from trainer.scale.choices import resolve
    from trainer.scale.placement import detect_gpus, node_for
    from trainer.scale.plan import shape_for

    started = time.monotonic()
    shutil.rmtree(args.run_dir, ignore_errors=True)
    args.run_dir.mkdir(parents=True)
    model_dir = args.model
    if model_dir is None:
        from policy_server.models.tiny import build_tiny_model

        model_dir = build_tiny_model(args.run_dir / "model", seed=args.seed, corpus=maze_corpus(100))
    args.target_modules = TINY_TARGET_MODULES if args.model is None else list(PROJECTION_MODULES)
    train_file, adapter = (args.train_file, None) if args.agent else _maze(args, model_dir)
    warm_start_s = time.monotonic() - started
    with _agent(args) as agent:
        config = build_config(args, model_dir, adapter, train_file, agent)
        # The plan of what the run trains with: `rft train` applies the plan's choices first.
        plan = resolve(config, shape_for(model_dir), node_for(config, detect_gpus())).plan
        summary = train(config)
    return {
        "device": args.device,
        "gpu": _gpu_name() if args.device == "cuda" else None,
        "engine": config.engine,
        "model": str(model_dir),
        "agent": args.agent or "maze",
        "steps": args.steps,
        "rollouts_per_step": args.rows * args.generations,
        **summarise(summary.history),
        "peak_memory_gb": _peak_memory(args, config),
        "plan": plan.as_dict(),
        "warm_start_s": warm_start_s,
        "seconds": time.monotonic() - started,
    }


def _peak_memory(args: argparse.Namespace, config: TrainConfig) -> dict[str, float | None]:
    if args.device != "cuda":  # CPU: the learner and the hf engine share this process
        rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"learner_and_hf_engine_rss": rss_kib * 1024 / 1e9, "vllm": None}
    import torch

    # vLLM takes its share of the GPU when it starts (gpu_memory_utilization) and holds it.
    total = torch.cuda.get_device_properties(0).total_memory
    return {"learner": cuda_peak_memory_gb(), "vllm": config.vllm.gpu_memory_utilization * total / 1e9}


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--model", type=Path, help="model directory (default: a tiny model built here)")
    parser.add_argument("--vllm-python", help="Python of vLLM's GPU environment (--device cuda)")
    parser.add_argument("--vllm-memory", type=float, default=0.35, help="vLLM's share of the GPU")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=4, help="mazes per step")
    parser.add_argument("--generations", type=int, default=8, help="rollouts per maze")
    parser.add_argument("--sft-steps", type=int, default=40)
    parser.add_argument("--stage-timeout-s", type=float, default=180.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--agent", help="URL of a running agent to train against instead of the maze")
    parser.add_argument("--train-file", type=Path, help="training rows for --agent (JSONL)")
    parser.add_argument("--run-dir", type=Path, default=REPO / "runs" / "device-check")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "device_check.json")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print(
                f"device_check: torch {torch.__version__} sees no CUDA device (CUDA build: "
                f"{torch.version.cuda or 'none'}): install a CUDA build of torch on a machine with a GPU",
                file=sys.stderr,
            )
            return 2
        if not args.vllm_python or not Path(args.vllm_python).exists():
            print(
                "device_check: --vllm-python must name the Python of vLLM's GPU environment", file=sys.stderr
            )
            return 2
    if args.agent and args.train_file is None:
        print("device_check: --agent needs --train-file (the rows to send it)", file=sys.stderr)
        return 2
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({key: result[key] for key in ("step_time_s", "sampled_tokens_per_s", "peak_memory_gb")}))
    if result["updates_applied"] == 0:
        print("device_check: no GRPO update was applied (no group had reward variance)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
