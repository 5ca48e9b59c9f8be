"""``rft sft``: supervised warm start of a LoRA adapter on demonstrations.

A demonstration is one chat request as the agent sends it: ``{"messages": [...], "tools": [...]}`` in
OpenAI format, ending with the assistant's last turn. It is rendered through the model's own chat
template exactly as the policy server renders a rollout (same message normalisation, same template;
``--chat-template`` replaces the model's own, as the ``chat_template`` setting does for serving),
and the loss covers only what the model itself would sample: each assistant turn's content and
tool calls up to and including its end-of-turn token. Everything else (system prompt, tool list,
user messages, tool results, the template's role headers) is context.

The adapter is saved in peft format, the same as the GRPO learner's versions, so ``rft train`` can
start from it.

    rft sft --model MODEL_DIR --maze-demos 300 --maze-noise 0.3 --out runs/sft-adapter --steps 400 \\
        --target-modules embed_tokens,q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head
    rft sft --model MODEL_DIR --data demos.jsonl --out runs/sft-adapter --steps 200
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from policy_server.models import local_model_dir
from trainer.ops import pin_cpu_kernels
from trainer.sft.common import DEFAULT_TARGET_MODULES, DemonstrationError, load_demonstrations
from trainer.sft.progress import SftProgress
from trainer.sft.text import run_sft

# Adds further demonstration sources to the parser (the maze demo's --maze-demos): (parser, the group
# of mutually exclusive sources --data is in).
SourceOptions = Callable[[argparse.ArgumentParser, argparse._MutuallyExclusiveGroup], None]
# The demonstrations the parsed arguments name.
Demonstrations = Callable[[argparse.Namespace], list[dict[str, Any]]]


def build_parser(add_sources: SourceOptions | None = None) -> argparse.ArgumentParser:
    """``rft sft``'s options; ``add_sources`` adds demonstration sources next to ``--data``."""
    parser = argparse.ArgumentParser(prog="rft sft", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", required=True, type=Path, help="base model directory (transformers format)"
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--data", type=Path, help='JSONL of {"messages": [...], "tools": [...]} demonstrations'
    )
    if add_sources is not None:
        add_sources(parser, source)
    parser.add_argument("--out", required=True, type=Path, help="directory to write the adapter into")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps (default 100)")
    parser.add_argument("--lr", type=float, default=2e-3, help="learning rate (default 2e-3)")
    parser.add_argument("--batch-size", type=int, default=16, help="demonstrations per step (default 16)")
    parser.add_argument("--lora-r", type=int, default=16, help="LoRA rank (default 16)")
    parser.add_argument("--lora-alpha", type=float, default=32.0, help="LoRA alpha (default 32)")
    parser.add_argument("--lora-dropout", type=float, default=0.0)
    parser.add_argument(
        "--target-modules",
        default=",".join(DEFAULT_TARGET_MODULES),
        help="comma-separated module names to adapt (default: every projection; a tiny model built "
        "from scratch needs embed_tokens and lm_head too)",
    )
    parser.add_argument(
        "--target-parameters",
        default="",
        help="comma-separated stacked parameters to adapt too, as lora.target_parameters: a "
        "mixture-of-experts model's experts (gpt-oss: mlp.experts.gate_up_proj,mlp.experts.down_proj)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--device", default="auto", help="torch device: auto (the first GPU, else cpu), cpu, cuda:N"
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="the base model's dtype (default auto: bfloat16 on CUDA, float32 on the CPU)",
    )
    parser.add_argument(
        "--cpu-kernels",
        default="avx2",
        choices=("avx2", "native"),
        help="on x86, avx2 (default) pins torch's, MKL's and oneDNN's CPU kernels to AVX2 so a seed "
        "gives the same adapter on any x86-64 machine with AVX2; native: the widest this CPU has",
    )
    parser.add_argument(
        "--chat-template",
        help="template replacing the model's own: a shipped name (chatml-tools) or a Jinja file; use "
        "the one training will serve with (the config's chat_template)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """``rft sft`` on a JSONL file of demonstrations (``--data``)."""
    return run(build_parser().parse_args(argv), lambda args: load_demonstrations(args.data))


def run(args: argparse.Namespace, demonstrations: Demonstrations) -> int:
    """Train and save a warm-start adapter on ``demonstrations(args)``; prints the loss, the time spent
    and the time left as it goes (:class:`~trainer.sft.progress.SftProgress`)."""
    if args.cpu_kernels == "avx2":
        pin_cpu_kernels()  # before the first tensor operation
    try:
        local_model_dir(args.model)
        examples = demonstrations(args)
        result = run_sft(
            args.model,
            examples,
            args.out,
            steps=args.steps,
            learning_rate=args.lr,
            batch_size=args.batch_size,
            lora_r=args.lora_r,
            lora_alpha=args.lora_alpha,
            lora_dropout=args.lora_dropout,
            target_modules=[name.strip() for name in args.target_modules.split(",") if name.strip()],
            target_parameters=[name.strip() for name in args.target_parameters.split(",") if name.strip()],
            seed=args.seed,
            on_step=SftProgress(args.steps),
            chat_template=args.chat_template,
            device=args.device,
            dtype=args.dtype,
        )
    except (DemonstrationError, ValueError, OSError) as exc:
        print(f"rft sft: {exc}", file=sys.stderr)
        return 2
    print(f"adapter written to {result.adapter_dir} ({result.seconds:.0f} s)")
    return 0
