"""Breadth-first search: the shortest path, for demonstrations and to prove a maze solvable."""

from __future__ import annotations

from collections import deque

from agents.maze.env import Cell, Direction, Maze


def shortest_path(maze: Maze, start: Cell | None = None) -> list[Direction] | None:
    """The moves of a shortest path from ``start`` (default: the maze's start) to the goal.

    Directions are tried in a fixed order, so the path is deterministic. None if unreachable.
    """
    origin = maze.start if start is None else start
    previous: dict[Cell, tuple[Cell, Direction] | None] = {origin: None}
    queue = deque([origin])
    while queue:
        cell = queue.popleft()
        if cell == maze.goal:
            break
        for direction in Direction:
            nxt = maze.neighbour(cell, direction)
            if maze.is_open(nxt) and nxt not in previous:
                previous[nxt] = (cell, direction)
                queue.append(nxt)
    if maze.goal not in previous:
        return None
    moves: list[Direction] = []
    cell = maze.goal
    while (step := previous[cell]) is not None:
        cell, direction = step
        moves.append(direction)
    return moves[::-1]
