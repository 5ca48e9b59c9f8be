"""The maze as a picture: one square per cell, walls, goal and agent where the environment has them,
and the same state always encodes to the same bytes."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from agents.maze.dataset import eval_rows, row_maze
from agents.maze.env import MazeGame
from agents.maze.generator import generate
from agents.maze.picture import AGENT, CELL_PX, GOAL, OPEN, WALL, canvas_side, game_png, render_png
from agents.maze.solver import shortest_path


def _pixels(png: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(png))
    assert image.format == "PNG" and image.mode == "RGB"
    return image


@pytest.mark.parametrize("row", eval_rows()[:3])
def test_every_cell_shows_what_the_environment_holds(row: dict) -> None:
    maze = row_maze(row)
    image = _pixels(render_png(maze, maze.start))
    # One 16-pixel square per cell (2x2 patches of 8 pixels, one merged image token); the demo's
    # sizes (4 to 6 cells) fill the picture exactly.
    assert image.size == (maze.size * CELL_PX, maze.size * CELL_PX)
    side = maze.size
    for r in range(side):
        for c in range(side):
            expected = AGENT if (r, c) == maze.start else GOAL if (r, c) == maze.goal else None
            outside = r >= maze.size or c >= maze.size
            expected = expected or (WALL if (r, c) in maze.walls or outside else OPEN)
            # Every pixel of the cell's square, corners included.
            square = image.crop((c * CELL_PX, r * CELL_PX, (c + 1) * CELL_PX, (r + 1) * CELL_PX))
            assert set(square.getdata()) == {expected}, (r, c)


def test_the_picture_follows_the_agent_and_repeats_byte_for_byte() -> None:
    maze = row_maze(eval_rows()[1])
    game = MazeGame(maze)
    frames = [game_png(game)]
    for direction in shortest_path(maze) or []:
        game.step(direction)
        frames.append(game_png(game))
    assert game.reached_goal
    # Each move changes the picture; replaying the episode gives the very same bytes.
    assert len(set(frames)) == len(frames)
    replay = MazeGame(maze)
    assert game_png(replay) == frames[0]
    # At the goal the agent is drawn over it: no green left.
    assert GOAL not in set(_pixels(frames[-1]).getdata())


def test_a_larger_grid_gets_a_larger_canvas_in_whole_patches() -> None:
    maze = generate(3, 9)
    image = _pixels(render_png(maze, maze.start))
    assert image.size == (144, 144) and canvas_side(maze) == 144  # 9 cells of 16 pixels


def test_a_cell_size_below_one_pixel_is_refused() -> None:
    maze = row_maze(eval_rows()[0])
    with pytest.raises(ValueError, match="cell_px"):
        render_png(maze, maze.start, cell_px=0)
