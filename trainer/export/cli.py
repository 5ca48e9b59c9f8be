"""``rft export RUN|ADAPTER OUT [--merge]``: a run's newest adapter (or an adapter directory) written for
serving, checked against the trained policy before it is kept (docs/serving.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from policy_server.models import ChatTemplateError
from trainer.export.source import ExportError, locate


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rft export",
        description="Write a run's newest adapter version (or an adapter directory) for serving: a peft "
        "adapter in the base model's dtype for vLLM's --lora-modules, or with --merge full merged "
        "weights with the tokenizer and chat template. Either is checked against the trained policy "
        "(greedy tokens and logprobs on a few chat prompts) before OUT is written.",
    )
    parser.add_argument(
        "source", type=Path, help="a run directory (output_dir of rft train) or an adapter directory"
    )
    parser.add_argument("out", type=Path, help="the directory to write (new, or empty)")
    parser.add_argument("--merge", action="store_true", help="merge the adapter into the base's weights")
    parser.add_argument(
        "--model", type=Path, help="the base model directory (default: the one the adapter was trained on)"
    )
    parser.add_argument(
        "--chat-template",
        help="the chat template the policy was served with, a shipped name or a Jinja file (default: the "
        "run's chat_template, else the model's own)",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        help="largest logprob difference accepted (default: 1e-3 for float32, 5e-2 bfloat16, 2e-2 float16)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from trainer.export.card import serving_commands
    from trainer.export.exporting import base_dtype, export

    try:
        source = locate(args.source, model=args.model, chat_template=args.chat_template)
        out = args.out.resolve()
        dtype = str(base_dtype(source.base_model)).removeprefix("torch.")
        kind = "merged weights" if args.merge else "the adapter"
        print(f"exporting {source.adapter_dir} on {source.base_model} as {kind} in {dtype} ...")
        verification = export(source, out, merge=args.merge, tolerance=args.tolerance)
    except (ExportError, ChatTemplateError) as error:
        print(f"rft export: {error}")
        return 1
    print(verification.sentence())
    print(f"wrote {out} (model card: {out / 'README.md'}); serve it with vLLM's Python, or rft:")
    for command in serving_commands(source, out, merge=args.merge, dtype=base_dtype(source.base_model)):
        print(f"  {command}")
    return 0
