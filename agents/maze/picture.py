"""Image observations of a maze episode: the grid as a small PNG, for vision-language policies.

The picture shows the whole map from above, one square of ``CELL_PX`` pixels per cell: open cells
white, walls dark grey, the goal green and the agent blue (the agent drawn over the goal once it
stands on it). Colours are pure channels, so even a randomly initialised vision tower separates them.
The grid sits in the top-left corner of a square canvas of at least ``MIN_SIDE`` pixels whose side is
a multiple of ``SIDE_MULTIPLE``; the rest of the canvas is drawn as wall (a move off the grid is
blocked like one into a wall). Why: a vision-language model's image processor resizes an image to a
multiple of its patch size times its merge size (8 x 2 for ``rft model tiny-vision``), and a
resized map would smear cells across patches. On this canvas every cell is exactly 2x2 patches of 8
pixels, which the model merges into one image token: the language model gets one token per cell, at
the cell's row and column in its M-RoPE positions. A maze of the demo's sizes (4 to 6) fills its
picture exactly: 64 to 96 pixels a side, 16 to 36 image tokens. (With one 8-pixel patch a cell, a
merged token covered four cells, and on a 96-pixel canvas for every size the padding slowed the
warm start: docs/demo.md, the visual maze.)
Unlike the text observation it says nothing about distances or which step brings the agent closer:
where the goal lies and which neighbours are walls is for the policy to see.

The bytes are deterministic: the same episode state always encodes to the same PNG (no timestamps,
no metadata, a fixed compression level), so a trace's content hash names the state it shows.
"""

from __future__ import annotations

import io
from typing import Literal

from agents.maze.env import Cell, Maze, MazeGame

CELL_PX = 16
MIN_SIDE = 64
SIDE_MULTIPLE = 16
IMAGE_FORMAT: Literal["png"] = "png"
OPEN = (255, 255, 255)
WALL = (64, 64, 64)
GOAL = (0, 200, 0)
AGENT = (0, 0, 255)


def cell_colour(maze: Maze, position: Cell, cell: Cell) -> tuple[int, int, int]:
    """The colour of ``cell`` when the agent stands at ``position``."""
    if cell == position:
        return AGENT
    if cell == maze.goal:
        return GOAL
    return WALL if cell in maze.walls else OPEN


def canvas_side(maze: Maze, cell_px: int | None = None) -> int:
    """The picture's side in pixels: the grid's, rounded up to ``SIDE_MULTIPLE``, at least ``MIN_SIDE``."""
    grid = maze.size * (CELL_PX if cell_px is None else cell_px)
    return max(MIN_SIDE, -(-grid // SIDE_MULTIPLE) * SIDE_MULTIPLE)


def render_png(maze: Maze, position: Cell, cell_px: int | None = None) -> bytes:
    """The maze with the agent at ``position`` as PNG bytes (``canvas_side`` pixels a side), ``cell_px``
    pixels a cell (default ``CELL_PX``, read when called)."""
    from PIL import Image

    cell_px = CELL_PX if cell_px is None else cell_px
    if cell_px < 1:
        raise ValueError(f"cell_px must be at least 1, got {cell_px}")
    side = canvas_side(maze, cell_px)
    image = Image.new("RGB", (side, side), WALL)
    for row in range(maze.size):
        for col in range(maze.size):
            left, top = col * cell_px, row * cell_px
            image.paste(cell_colour(maze, position, (row, col)), (left, top, left + cell_px, top + cell_px))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=9)
    return buffer.getvalue()


def game_png(game: MazeGame, cell_px: int | None = None) -> bytes:
    """The episode's current state as PNG bytes."""
    return render_png(game.maze, game.position, cell_px)
