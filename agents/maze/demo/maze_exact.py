"""The exact success of a maze policy, read off the model instead of played.

A played evaluation (``rft demo``'s 64 mazes x 2 rollouts at temperature 1) carries a sampling error
of about 4 points, too much to tell two recipes apart on one seed. The maze agent shows the policy
only the latest observation (``keep_last_observation``), so the request of every call is fixed by
the state: the cell, the moves left and the last move (with whether it moved). This module walks
every state reachable from each maze's start, asks the model once per state for the probability of
each of the four well-formed ``move`` calls (the whole assistant turn, teacher-forced, rendered
exactly as the warm start's demonstrations are), and computes the chance of reaching the goal by
dynamic programming, as ``agents.maze.baselines`` does for the walkers. It costs more than one
played evaluation (four teacher-forced turns for each of the many states of the 64 mazes), and has
no sampling error.

``success`` is the chance of reaching the goal when every call is one of the four, renormalised
over them: the success the policy's choice of moves gives, without its format slips (a played
evaluation shows those as "stopped early"). ``call_mass`` is the mean probability, over the states,
that the model writes one of the four turns token for token, end of turn included; the agent also
accepts calls rendered otherwise (other endings, spacing), so it understates the format's reliability.

    python -m agents.maze.demo.maze_exact RUN_DIR [--temperature T]   # a demo's warm start and final adapter
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol

import torch

from agents.maze.baselines import DIRECTIONS
from agents.maze.dataset import eval_rows, row_maze
from agents.maze.demonstrations import call_demonstration, context_after
from agents.maze.env import Direction, Maze, MazeGame, StepResult
from agents.maze.observation import Observation

# (cell, moves left, last move and whether it moved): all a call's request depends on.
StateKey = tuple[tuple[int, int], int, tuple[Direction, bool] | None]


@dataclass(frozen=True)
class ExactScore:
    success: float
    call_mass: float
    states: int
    seconds: float


def _fork(game: MazeGame) -> MazeGame:
    twin = MazeGame(game.maze)
    twin.position, twin.moves, twin.reached_goal = game.position, list(game.moves), game.reached_goal
    return twin


def reachable_requests(maze: Maze, observation: Observation = "text") -> dict[StateKey, list[dict[str, Any]]]:
    """Every state in which the agent calls the model, with the four demonstrations (request plus one
    well-formed move, in ``DIRECTIONS`` order) the policy is scored on there."""
    found: dict[StateKey, list[dict[str, Any]]] = {}
    pending: list[tuple[MazeGame, tuple[Direction, StepResult] | None]] = [(MazeGame(maze), None)]
    while pending:
        game, last = pending.pop()
        key: StateKey = (game.position, game.moves_left, None if last is None else (last[0], last[1].moved))
        if game.done or key in found:
            continue
        context = context_after(game, last, observation)
        found[key] = [call_demonstration(maze, context, d, len(game.moves)) for d in DIRECTIONS]
        for direction in DIRECTIONS:
            child = _fork(game)
            pending.append((child, (direction, child.step(direction))))
    return found


class Scorer(Protocol):
    def probabilities(
        self, demonstrations: Sequence[dict[str, Any]], temperature: float = 1.0
    ) -> list[float]:
        """P(the demonstration's last message | its request) for each demonstration."""
        ...


class CallScorer:
    """A model (text or vision-language) and LoRA adapter that give each demonstration's assistant
    turn its probability, encoded as the warm start encodes demonstrations."""

    def __init__(
        self, model_dir: str | Path, adapter_dir: str | Path | None = None, chat_template: str | None = None
    ) -> None:
        from policy_server.models import load_model

        self.model_dir, self.chat_template = model_dir, chat_template
        model = load_model(model_dir, dtype=torch.float32)
        if adapter_dir is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(adapter_dir))
        self.model = model.eval()

    @torch.no_grad()
    def probabilities(
        self, demonstrations: Sequence[dict[str, Any]], temperature: float = 1.0, batch_size: int = 32
    ) -> list[float]:
        """P(the assistant turn | its request) for each demonstration, sampling at ``temperature``."""
        from trainer.sft import trainee_for, turn_logprobs

        trainee = trainee_for(self.model_dir, demonstrations, self.chat_template)
        # A demonstration may train as several sequences (trainer.sft.turns): its turns' log-probs add.
        owners = [index for index, sequences in enumerate(trainee.encoded) for _ in sequences]
        sequences = [sequence for sequences in trainee.encoded for sequence in sequences]
        logprobs = torch.zeros(len(trainee.encoded), dtype=torch.float64)
        for start in range(0, len(sequences), batch_size):
            batch = trainee.batch(sequences[start : start + batch_size])
            logits = trainee.forward(self.model, batch)
            owner = torch.tensor(owners[start : start + batch_size])
            logprobs.index_add_(0, owner, turn_logprobs(logits, batch, temperature).cpu())
        return torch.exp(logprobs).tolist()


def exact_success(
    mazes: Sequence[Maze], scorer: Scorer, temperature: float = 1.0, observation: Observation = "text"
) -> ExactScore:
    """Mean exact success over ``mazes`` of the policy ``scorer`` holds (see the module docstring)."""
    started = time.monotonic()
    states = [reachable_requests(maze, observation) for maze in mazes]
    flat = [demo for found in states for demos in found.values() for demo in demos]
    probabilities = iter(scorer.probabilities(flat, temperature))
    moves = [{key: [next(probabilities) for _ in DIRECTIONS] for key in found} for found in states]
    success = sum(_reach(maze, table) for maze, table in zip(mazes, moves, strict=True)) / len(mazes)
    masses = [sum(chances) for table in moves for chances in table.values()]
    return ExactScore(success, sum(masses) / len(masses), len(masses), time.monotonic() - started)


def _reach(maze: Maze, moves: dict[StateKey, list[float]]) -> float:
    @cache
    def reach(cell: tuple[int, int], moves_left: int, last: tuple[Direction, bool] | None) -> float:
        if cell == maze.goal:
            return 1.0
        if moves_left == 0:
            return 0.0
        chances = moves[(cell, moves_left, last)]
        total = sum(chances)
        value = 0.0
        for direction, chance in zip(DIRECTIONS, chances, strict=True):
            target = maze.neighbour(cell, direction)
            moved = maze.is_open(target)
            value += chance / total * reach(target if moved else cell, moves_left - 1, (direction, moved))
        return value

    return reach(maze.start, maze.move_limit, None)


def model_observation(model_dir: str | Path) -> Observation:
    """What a demo's model is shown: the picture for a vision-language model, else the text."""
    from transformers import AutoConfig

    from policy_server.models import is_vision_model

    return "image" if is_vision_model(AutoConfig.from_pretrained(str(model_dir))) else "text"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agents.maze.demo.maze_exact", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "run_dir", type=Path, help="an rft demo run directory (model/, sft-adapter/, adapter/)"
    )
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1)")
    parser.add_argument("--mazes", type=int, default=64, help="evaluation mazes (default: the demo's 64)")
    args = parser.parse_args(argv)
    mazes = [row_maze(row) for row in eval_rows()[: args.mazes]]
    observation = model_observation(args.run_dir / "model")
    report = {}
    for name in ("sft-adapter", "adapter"):
        if (args.run_dir / name).is_dir():
            scorer = CallScorer(args.run_dir / "model", args.run_dir / name)
            score = exact_success(mazes, scorer, args.temperature, observation)
            report[name] = score.__dict__
            print(
                f"{name:12} success {score.success:.1%} (every call well formed), one of the four calls "
                f"token for token {score.call_mass:.1%} ({score.states} states, {score.seconds:.0f} s)"
            )
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
