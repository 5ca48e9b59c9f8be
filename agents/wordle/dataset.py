"""The Wordle dataset: JSONL rows that carry only the secret word, e.g. ``{"secret": "crane"}``.

Each line becomes one payload's ``prompt`` as it is. 640 training and 128 validation secrets are
drawn without replacement from the answer list (so the splits are disjoint), reproducibly per seed::

    python -m agents.wordle.dataset OUT_DIR [--seed N]

writes ``OUT_DIR/train.jsonl`` and ``OUT_DIR/validation.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path

from agents.wordle.word_lists import answers

TRAIN_SIZE = 640
VALIDATION_SIZE = 128
DEFAULT_SEED = 0
TRAIN_FILE = "train.jsonl"
VALIDATION_FILE = "validation.jsonl"


def split_secrets(
    seed: int = DEFAULT_SEED,
    train_size: int = TRAIN_SIZE,
    validation_size: int = VALIDATION_SIZE,
    pool: Sequence[str] | None = None,
) -> tuple[list[str], list[str]]:
    """Disjoint (train, validation) secret lists drawn from ``pool`` (default: the answer list)."""
    words = sorted(set(answers() if pool is None else pool))
    needed = train_size + validation_size
    if needed > len(words):
        raise ValueError(f"asked for {needed} secrets but the pool holds only {len(words)} words")
    drawn = random.Random(seed).sample(words, needed)
    return drawn[:train_size], drawn[train_size:]


def write_rows(path: Path, secrets: Sequence[str]) -> None:
    path.write_text("".join(json.dumps({"secret": secret}) + "\n" for secret in secrets), encoding="utf-8")


def write_dataset(out_dir: Path, seed: int = DEFAULT_SEED) -> tuple[Path, Path]:
    """Write the two JSONL files; returns their paths (train, validation)."""
    train, validation = split_secrets(seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    train_path, validation_path = out_dir / TRAIN_FILE, out_dir / VALIDATION_FILE
    write_rows(train_path, train)
    write_rows(validation_path, validation)
    return train_path, validation_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the Wordle train/validation JSONL files.")
    parser.add_argument("out_dir", type=Path, help="directory to write train.jsonl and validation.jsonl into")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="random seed of the split")
    args = parser.parse_args(argv)
    train_path, validation_path = write_dataset(args.out_dir, args.seed)
    print(f"wrote {TRAIN_SIZE} rows to {train_path} and {VALIDATION_SIZE} rows to {validation_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
