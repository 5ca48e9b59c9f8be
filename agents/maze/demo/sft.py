"""``rft sft`` with the maze's demonstrations as a source besides ``--data``: ``--maze-demos N`` walks
N training mazes (:mod:`agents.maze.demonstrations`)."""

from __future__ import annotations

import argparse
from typing import Any

from agents.maze.demonstrations import maze_demonstrations
from trainer.sft import build_parser, load_demonstrations, run


def _maze_sources(parser: argparse.ArgumentParser, source: argparse._MutuallyExclusiveGroup) -> None:
    source.add_argument(
        "--maze-demos", type=int, metavar="N", help="demonstrations walked on N training mazes"
    )
    parser.add_argument(
        "--maze-noise",
        type=float,
        default=0.0,
        metavar="P",
        help="with --maze-demos: the walker's chance of a random move instead of a shortest-path one "
        "(default 0: perfect demonstrations)",
    )
    parser.add_argument(
        "--maze-labels",
        choices=("walker", "shortest"),
        default="walker",
        help="with --maze-demos: each call is the walker's own move (default) or the shortest-path "
        "move from the state the walker reached (clean labels on a noisy walk)",
    )


def _demonstrations(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.data is not None:
        return load_demonstrations(args.data)
    return maze_demonstrations(
        args.maze_demos, noise=args.maze_noise, seed=args.seed, labels=args.maze_labels
    )


def main(argv: list[str] | None = None) -> int:
    """``rft sft``: train and save a warm-start adapter; prints the loss as it goes."""
    return run(build_parser(_maze_sources).parse_args(argv), _demonstrations)
