"""Maze generation: the maze of a seed and size, solvable by construction.

A monotone path from start to goal is carved first, then walls are scattered over the other cells.
The shortest path therefore runs straight towards the goal, but not every step towards the goal stays
on one: some lead into walls.
"""

from __future__ import annotations

import random

from agents.maze.env import Cell, Maze
from agents.maze.solver import shortest_path

MIN_SIZE = 3
MAX_SIZE = 9
WALL_DENSITY = 0.3
# Moves allowed beyond the shortest path: room for one detour, not for wandering.
MOVE_SLACK = 2


def generate(seed: int, size: int) -> Maze:
    """The maze for ``seed``: the same seed and size always give the same maze."""
    if not MIN_SIZE <= size <= MAX_SIZE:
        raise ValueError(f"maze size must be between {MIN_SIZE} and {MAX_SIZE}, got {size}")
    rng = random.Random(f"maze-{size}-{seed}")
    cells = [(r, c) for r in range(size) for c in range(size)]
    start = rng.choice(cells)
    # The goal is at least size - 1 steps away, so every maze takes a few decisions.
    goal = rng.choice([cell for cell in cells if _manhattan(cell, start) >= size - 1])
    carved = _monotone_path(start, goal, rng)
    walls = frozenset(cell for cell in cells if cell not in carved and rng.random() < WALL_DENSITY)
    maze = Maze(size=size, walls=walls, start=start, goal=goal, move_limit=0)
    path = shortest_path(maze)
    if path is None:  # impossible: the carved path is open
        raise AssertionError(f"maze {seed} of size {size} is not solvable")
    return Maze(size=size, walls=walls, start=start, goal=goal, move_limit=len(path) + MOVE_SLACK)


def _manhattan(a: Cell, b: Cell) -> int:
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def _monotone_path(start: Cell, goal: Cell, rng: random.Random) -> set[Cell]:
    vertical = [(1 if goal[0] > start[0] else -1, 0)] * abs(goal[0] - start[0])
    horizontal = [(0, 1 if goal[1] > start[1] else -1)] * abs(goal[1] - start[1])
    steps = vertical + horizontal
    rng.shuffle(steps)
    cell, path = start, {start}
    for d_row, d_col in steps:
        cell = (cell[0] + d_row, cell[1] + d_col)
        path.add(cell)
    return path
