"""Maze baselines: exact walker success rates agree with sampled episodes; the observation-only
policy's search never does worse than its start and never beats the shortest path."""

from __future__ import annotations

import random

from agents.maze.baselines import (
    baselines,
    greedy_walker,
    noisy_walker,
    random_walker,
    success_probability,
)
from agents.maze.dataset import eval_rows, row_maze
from agents.maze.env import Maze, MazeGame


def _sampled_success(maze: Maze, policy, episodes: int, rng: random.Random) -> float:
    wins = 0
    for _ in range(episodes):
        game = MazeGame(maze)
        while not game.done:
            moves = policy(maze, game.position)
            game.step(rng.choices(list(moves), weights=list(moves.values()))[0])
        wins += game.reached_goal
    return wins / episodes


def test_exact_success_matches_sampled_episodes() -> None:
    rng = random.Random(0)
    mazes = [row_maze(row) for row in eval_rows()[:6]]
    for policy in (random_walker, greedy_walker, noisy_walker(0.3)):
        for maze in mazes:
            exact = success_probability(maze, policy)
            sampled = _sampled_success(maze, policy, 400, rng)
            # 400 Bernoulli draws: 4 standard deviations is at most 0.1.
            assert abs(exact - sampled) <= 0.1, (policy, maze, exact, sampled)


def test_walkers_are_ordered_on_the_evaluation_mazes() -> None:
    mazes = [row_maze(row) for row in eval_rows()[:16]]
    result = baselines(mazes)
    assert result["oracle"] == 1.0  # every maze is solvable within its move limit
    assert 0.0 < result["random"] < result["noisy"] < 1.0
    assert result["noisy"] < result["observation"] <= result["oracle"]
    assert 0.0 < result["greedy"] <= 1.0
    noiseless = sum(success_probability(maze, noisy_walker(0.0)) for maze in mazes) / len(mazes)
    assert noiseless == 1.0
