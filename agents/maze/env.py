"""The maze: a square grid of open and wall cells, a start, a goal and a move limit, and the game
played on it. Generated from a seed by :mod:`agents.maze.generator`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

Cell = tuple[int, int]  # (row, column), row 0 at the top


class Direction(StrEnum):
    UP = "up"
    DOWN = "down"
    LEFT = "left"
    RIGHT = "right"

    @property
    def delta(self) -> Cell:
        return _DELTAS[self]


_DELTAS: dict[Direction, Cell] = {
    Direction.UP: (-1, 0),
    Direction.DOWN: (1, 0),
    Direction.LEFT: (0, -1),
    Direction.RIGHT: (0, 1),
}


@dataclass(frozen=True)
class Maze:
    """One maze layout; immutable, so many episodes can share it."""

    size: int
    walls: frozenset[Cell]
    start: Cell
    goal: Cell
    move_limit: int

    def is_open(self, cell: Cell) -> bool:
        row, col = cell
        return 0 <= row < self.size and 0 <= col < self.size and cell not in self.walls

    def neighbour(self, cell: Cell, direction: Direction) -> Cell:
        d_row, d_col = direction.delta
        return (cell[0] + d_row, cell[1] + d_col)

    def open_directions(self, cell: Cell) -> list[Direction]:
        return [d for d in Direction if self.is_open(self.neighbour(cell, d))]

    def to_dict(self) -> dict[str, object]:
        return {
            "size": self.size,
            "walls": sorted([list(cell) for cell in self.walls]),
            "start": list(self.start),
            "goal": list(self.goal),
            "move_limit": self.move_limit,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Maze:
        try:
            maze = cls(
                size=int(data["size"]),
                walls=frozenset((int(r), int(c)) for r, c in data["walls"]),
                start=(int(data["start"][0]), int(data["start"][1])),
                goal=(int(data["goal"][0]), int(data["goal"][1])),
                move_limit=int(data["move_limit"]),
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ValueError(
                "a maze needs 'size', 'walls' ([[row, col], ...]), 'start' and 'goal' ([row, col]) "
                f"and 'move_limit': {exc}"
            ) from exc
        if not (maze.is_open(maze.start) and maze.is_open(maze.goal)) or maze.start == maze.goal:
            raise ValueError("a maze's start and goal must be two different open cells inside the grid")
        return maze


@dataclass(frozen=True)
class StepResult:
    """What one move did."""

    moved: bool  # False when a wall or the edge blocked the move
    reached_goal: bool
    out_of_moves: bool

    @property
    def done(self) -> bool:
        return self.reached_goal or self.out_of_moves


@dataclass
class MazeGame:
    """One episode on a maze: the agent's position and the moves it has made."""

    maze: Maze
    position: Cell = field(init=False)
    moves: list[Direction] = field(default_factory=list, init=False)
    reached_goal: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.position = self.maze.start

    @property
    def moves_left(self) -> int:
        return self.maze.move_limit - len(self.moves)

    @property
    def done(self) -> bool:
        return self.reached_goal or self.moves_left <= 0

    def step(self, direction: Direction | str) -> StepResult:
        """Make one move; a blocked move stays in place but still counts against the limit."""
        if self.done:
            raise RuntimeError("the episode is over: the goal was reached or no moves are left")
        direction = Direction(direction)
        self.moves.append(direction)
        target = self.maze.neighbour(self.position, direction)
        moved = self.maze.is_open(target)
        if moved:
            self.position = target
        self.reached_goal = self.position == self.maze.goal
        return StepResult(moved=moved, reached_goal=self.reached_goal, out_of_moves=self.moves_left <= 0)

    @property
    def reward(self) -> float:
        """Sparse: 1.0 only when the goal was reached within the move limit."""
        return 1.0 if self.reached_goal else 0.0
