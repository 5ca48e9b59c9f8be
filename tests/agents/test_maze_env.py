"""The maze task: generation, rules, shortest paths, observations and the dataset split."""

from __future__ import annotations

import json

import pytest

from agents.maze.dataset import EVAL_SIZE, eval_rows, row_maze, train_rows, write_dataset
from agents.maze.env import Direction, Maze, MazeGame
from agents.maze.generator import MOVE_SLACK, generate
from agents.maze.render import direction_status, start_text, state_text, step_text
from agents.maze.solver import shortest_path


def corridor() -> Maze:
    """A 3x3 maze: start top-left, goal top-right, the middle of the top row walled off."""
    return Maze(size=3, walls=frozenset({(0, 1)}), start=(0, 0), goal=(0, 2), move_limit=5)


@pytest.mark.parametrize("size", [4, 5, 6])
def test_generated_mazes_are_seeded_and_solvable(size: int) -> None:
    for seed in range(40):
        maze = generate(seed, size)
        assert maze == generate(seed, size)
        path = shortest_path(maze)
        assert path is not None and len(path) >= size - 1
        assert maze.move_limit == len(path) + MOVE_SLACK
        assert maze.is_open(maze.start) and maze.is_open(maze.goal) and maze.start != maze.goal
    assert len({generate(seed, size) for seed in range(40)}) > 30


def test_generate_rejects_sizes_out_of_range() -> None:
    with pytest.raises(ValueError, match="between"):
        generate(0, 2)


def test_shortest_path_goes_around_walls() -> None:
    maze = corridor()
    assert shortest_path(maze) == [Direction.DOWN, Direction.RIGHT, Direction.RIGHT, Direction.UP]
    blocked = Maze(size=3, walls=frozenset({(0, 1), (1, 1), (2, 1)}), start=(0, 0), goal=(0, 2), move_limit=9)
    assert shortest_path(blocked) is None


def test_walls_and_edges_block_but_cost_a_move() -> None:
    game = MazeGame(corridor())
    result = game.step("right")  # into the wall
    assert not result.moved and game.position == (0, 0) and game.moves_left == 4
    result = game.step(Direction.UP)  # off the grid
    assert not result.moved and game.position == (0, 0) and game.moves_left == 3
    with pytest.raises(ValueError):
        game.step("north")


def test_goal_within_the_limit_wins() -> None:
    game = MazeGame(corridor())
    for direction in shortest_path(corridor()) or []:
        result = game.step(direction)
    assert result.reached_goal and result.done and game.reward == 1.0
    with pytest.raises(RuntimeError, match="over"):
        game.step("left")


def test_running_out_of_moves_loses() -> None:
    game = MazeGame(corridor())
    for _ in range(4):
        assert not game.step("left").done
    result = game.step("left")
    assert result.out_of_moves and not result.reached_goal and game.done and game.reward == 0.0


def test_reaching_the_goal_on_the_last_move_wins() -> None:
    maze = Maze(size=3, walls=frozenset({(0, 1)}), start=(0, 0), goal=(0, 2), move_limit=4)
    game = MazeGame(maze)
    for direction in shortest_path(maze) or []:
        result = game.step(direction)
    assert result.reached_goal and result.out_of_moves and game.reward == 1.0


def test_observation_text() -> None:
    game = MazeGame(corridor())
    assert direction_status(game.maze, game.position, Direction.RIGHT) == "wall"
    assert direction_status(game.maze, game.position, Direction.DOWN) == "farther"
    assert state_text(game) == (
        "Goal: 2 right. Moves left: 5. Around: UpWall DownFarther LeftWall RightWall."
    )
    assert start_text(game).startswith("Maze 3x3. Goal: 2 right.")
    game.step("down")
    result = game.step("right")
    assert step_text(game, result) == (
        "Moved. Goal: 1 up, 1 right. Moves left: 3. Around: UpWall DownFarther LeftFarther RightCloser."
    )
    assert step_text(game, game.step("left")).startswith("Moved. Goal: 1 up, 2 right.")
    game.step("up")
    assert step_text(game, game.step("left")) == "Blocked by a wall. Out of moves."
    winner = MazeGame(corridor())
    for direction in shortest_path(corridor()) or []:
        result = winner.step(direction)
    assert step_text(winner, result) == "Reached the goal."


def test_maze_round_trips_through_a_dict() -> None:
    maze = generate(3, 5)
    assert Maze.from_dict(json.loads(json.dumps(maze.to_dict()))) == maze
    assert row_maze({"maze": maze.to_dict()}) == maze
    with pytest.raises(ValueError, match="different open cells"):
        Maze.from_dict({**maze.to_dict(), "goal": list(maze.start)})
    with pytest.raises(ValueError, match="seed"):
        row_maze({"size": 5})


def test_evaluation_mazes_are_fixed_and_apart_from_training(tmp_path) -> None:
    evaluation = eval_rows()
    assert len(evaluation) == EVAL_SIZE and evaluation == eval_rows()
    eval_mazes = {row_maze(row) for row in evaluation}
    assert len(eval_mazes) == EVAL_SIZE
    train = train_rows(500)
    assert not eval_mazes & {row_maze(row) for row in train}
    assert {row["size"] for row in train} == {4, 5, 6}
    train_path, validation_path = write_dataset(tmp_path, train_size=50)
    assert [json.loads(line) for line in validation_path.read_text().splitlines()] == evaluation
    assert len(train_path.read_text().splitlines()) == 50


def test_an_image_dataset_asks_every_row_for_pictures(tmp_path) -> None:
    train_path, validation_path = write_dataset(tmp_path, train_size=5, observation="image")
    validation = [json.loads(line) for line in validation_path.read_text().splitlines()]
    assert validation == [{**row, "observation": "image"} for row in eval_rows()]
    assert all(json.loads(line)["observation"] == "image" for line in train_path.read_text().splitlines())
