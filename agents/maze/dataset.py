"""The maze dataset: JSONL rows that carry a maze's seed and size, e.g. ``{"seed": 17, "size": 5}``.

Each line becomes one payload's ``prompt`` as it is; the agent regenerates the maze from it. The 64
evaluation mazes are fixed (their own seed range, the same for every run); training mazes come from
another seed range, and any that happens to equal an evaluation maze is left out::

    python -m agents.maze.dataset OUT_DIR [--train-size N] [--observation image]

writes ``OUT_DIR/train.jsonl`` and ``OUT_DIR/validation.jsonl``. With ``--observation image`` every
row also says ``"observation": "image"``: the agent shows the policy a picture of the map.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from agents.maze.env import Maze
from agents.maze.generator import generate

SIZES = (4, 5, 6)
EVAL_SIZE = 64
TRAIN_SIZE = 2000
# Seeds of the evaluation mazes start here; training seeds count up from 0 and never reach it.
EVAL_SEED_BASE = 1_000_000
TRAIN_FILE = "train.jsonl"
VALIDATION_FILE = "validation.jsonl"


def row_maze(row: dict[str, Any]) -> Maze:
    """The maze a row describes: ``{"seed", "size"}`` or ``{"maze": {...}}`` (see ``Maze.to_dict``)."""
    if "maze" in row:
        return Maze.from_dict(row["maze"])
    try:
        return generate(int(row["seed"]), int(row["size"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f'a maze row must be like {{"seed": 17, "size": 5}} or {{"maze": {{...}}}}, got {row!r}: {exc}'
        ) from exc


def eval_rows() -> list[dict[str, int]]:
    """The 64 fixed evaluation mazes."""
    return [{"seed": EVAL_SEED_BASE + i, "size": SIZES[i % len(SIZES)]} for i in range(EVAL_SIZE)]


def train_rows(count: int = TRAIN_SIZE, first_seed: int = 0) -> list[dict[str, int]]:
    """``count`` training mazes, none equal to an evaluation maze."""
    held_out = {row_maze(row) for row in eval_rows()}
    rows = list(islice((row for row in _candidate_rows(first_seed) if row_maze(row) not in held_out), count))
    if len(rows) < count:
        raise ValueError(f"only {len(rows)} training mazes fit below seed {EVAL_SEED_BASE}")
    return rows


def _candidate_rows(first_seed: int) -> Iterator[dict[str, int]]:
    seed = first_seed
    while seed < EVAL_SEED_BASE:
        yield {"seed": seed, "size": SIZES[seed % len(SIZES)]}
        seed += 1


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def write_dataset(
    out_dir: Path, train_size: int = TRAIN_SIZE, observation: str = "text"
) -> tuple[Path, Path]:
    """Write train.jsonl and validation.jsonl into ``out_dir``; returns their paths.

    ``observation``: ``text`` writes the rows as they are (the agent's setting decides); any other
    kind (``image``) goes into every row.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    train_path, validation_path = out_dir / TRAIN_FILE, out_dir / VALIDATION_FILE
    extra = {} if observation == "text" else {"observation": observation}
    write_rows(train_path, [{**row, **extra} for row in train_rows(train_size)])
    write_rows(validation_path, [{**row, **extra} for row in eval_rows()])
    return train_path, validation_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the maze train/validation JSONL files.")
    parser.add_argument("out_dir", type=Path, help="directory to write train.jsonl and validation.jsonl into")
    parser.add_argument("--train-size", type=int, default=TRAIN_SIZE, help="number of training mazes")
    parser.add_argument(
        "--observation", choices=("text", "image"), default="text", help="what the agent shows the policy"
    )
    args = parser.parse_args(argv)
    train_path, validation_path = write_dataset(args.out_dir, args.train_size, args.observation)
    print(f"wrote {args.train_size} rows to {train_path} and {EVAL_SIZE} rows to {validation_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
