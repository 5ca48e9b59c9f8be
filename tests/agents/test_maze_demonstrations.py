"""Walker demonstrations: the perfect walker follows a shortest path; a noisy one makes random moves
yet every demonstration is a call the maze agent would really send at that point of the episode."""

from __future__ import annotations

import base64
import json
import random

import pytest

from agents.maze.dataset import row_maze, train_rows
from agents.maze.demonstrations import episode_demonstrations, maze_demonstrations
from agents.maze.env import Maze, MazeGame
from agents.maze.picture import game_png
from agents.maze.render import start_text, step_text
from agents.maze.solver import shortest_path


def _moves(demonstrations: list[dict]) -> list[str]:
    return [
        json.loads(demo["messages"][-1]["tool_calls"][0]["function"]["arguments"])["direction"]
        for demo in demonstrations
    ]


def _replay(maze: Maze, demonstrations: list[dict]) -> MazeGame:
    """Play the demonstrated moves; each call's context must be what the agent saw at that point."""
    game = MazeGame(maze)
    observation = start_text(game)
    for demo in demonstrations:
        context = demo["messages"][:-1]
        assert observation in json.dumps(context[-1]["content"])
        result = game.step(_moves([demo])[0])
        observation = step_text(game, result)
    return game


def test_the_perfect_walker_follows_a_shortest_path() -> None:
    maze = row_maze(train_rows(1)[0])
    demonstrations = episode_demonstrations(maze)
    assert _moves(demonstrations) == [direction.value for direction in shortest_path(maze) or []]
    assert _replay(maze, demonstrations).reached_goal


def test_a_noisy_walker_strays_yet_every_call_is_a_real_one() -> None:
    rng = random.Random(0)
    strayed = 0
    for row in train_rows(40):
        maze = row_maze(row)
        demonstrations = episode_demonstrations(maze, noise=0.5, rng=rng)
        game = _replay(maze, demonstrations)
        # It walks until the goal or the move limit, never beyond.
        assert game.done and len(demonstrations) <= maze.move_limit
        strayed += len(demonstrations) > len(shortest_path(maze) or [])
    assert strayed >= 10, "at noise 0.5 most walks should take more moves than the shortest path"


def test_shortest_labels_walk_the_same_noisy_walk_and_call_the_shortest_path_move() -> None:
    for row in train_rows(20):
        maze = row_maze(row)
        walker = episode_demonstrations(maze, noise=0.5, rng=random.Random(row["seed"]))
        clean = episode_demonstrations(maze, noise=0.5, rng=random.Random(row["seed"]), labels="shortest")
        # The same states in the same order (the context of every call is the walker's)...
        assert [demo["messages"][:-1] for demo in clean] == [demo["messages"][:-1] for demo in walker]
        # ...and every call is the first move of a shortest path from where the walker stood.
        game = MazeGame(maze)
        for move, label in zip(_moves(walker), _moves(clean), strict=True):
            assert label == (shortest_path(maze, game.position) or [])[0].value
            game.step(move)
    with pytest.raises(ValueError, match="labels must be one of walker, shortest"):
        episode_demonstrations(row_maze(train_rows(1)[0]), labels="teacher")  # type: ignore[arg-type]


def test_noisy_demonstrations_are_seeded() -> None:
    assert maze_demonstrations(5, noise=0.3, seed=1) == maze_demonstrations(5, noise=0.3, seed=1)
    assert maze_demonstrations(5, noise=0.3, seed=1) != maze_demonstrations(5, noise=0.3, seed=2)
    assert maze_demonstrations(5) == maze_demonstrations(5, seed=9), "without noise the seed is unused"


def test_bad_noise_is_refused() -> None:
    maze = row_maze(train_rows(1)[0])
    with pytest.raises(ValueError, match="between 0 and 1"):
        episode_demonstrations(maze, noise=1.5, rng=random.Random(0))
    with pytest.raises(ValueError, match="needs rng"):
        episode_demonstrations(maze, noise=0.2)


def test_image_demonstrations_show_the_picture_the_agent_would_send() -> None:
    maze = row_maze(train_rows(1)[0])
    demonstrations = episode_demonstrations(maze, observation="image")
    assert _moves(demonstrations) == [direction.value for direction in shortest_path(maze) or []]
    game = MazeGame(maze)
    for demo in demonstrations:
        *_, pictures, move = demo["messages"]
        assert move["role"] == "assistant" and pictures["role"] == "user"
        image = pictures["content"][-1]
        url = "data:image/png;base64," + base64.b64encode(game_png(game)).decode()
        assert image["type"] == "image_url" and image["image_url"]["url"] == url
        game.step(_moves([demo])[0])
    assert game.reached_goal
    # Later calls carry the tool message, then the picture as a user message (OpenAI's rule).
    assert [m["role"] for m in demonstrations[1]["messages"]] == [
        "system",
        "assistant",
        "tool",
        "user",
        "assistant",
    ]
    with pytest.raises(ValueError, match="observation must be one of"):
        episode_demonstrations(maze, observation="sound")  # type: ignore[arg-type]
