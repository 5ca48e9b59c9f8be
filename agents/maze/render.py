"""Text observations of a maze episode, kept apart from the environment so that other renderers
(an image for vision-language policies) can take its place.

The text is what an agent standing in the maze can tell: where the goal lies, how many moves are
left, and for each direction whether a wall blocks it or the step brings it closer to or farther from
the goal. It does not show the map: whether a step towards the goal leads into a dead end is for the
policy to learn. The four directions always come last and in the same order, each in one word, so
a small model finds them at the same distance from its answer every turn.
"""

from __future__ import annotations

from agents.maze.env import Cell, Direction, Maze, MazeGame, StepResult


def _distance(a: Cell, b: Cell) -> int:
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def goal_offset(maze: Maze, position: Cell) -> str:
    """'2 down, 1 left': where the goal lies relative to ``position``."""
    d_row, d_col = maze.goal[0] - position[0], maze.goal[1] - position[1]
    parts = []
    if d_row:
        parts.append(f"{abs(d_row)} {'down' if d_row > 0 else 'up'}")
    if d_col:
        parts.append(f"{abs(d_col)} {'right' if d_col > 0 else 'left'}")
    return ", ".join(parts) or "here"


def direction_status(maze: Maze, position: Cell, direction: Direction) -> str:
    """'wall', 'closer' or 'farther': what one step in ``direction`` would do."""
    target = maze.neighbour(position, direction)
    if not maze.is_open(target):
        return "wall"
    return "closer" if _distance(target, maze.goal) < _distance(position, maze.goal) else "farther"


def state_text(game: MazeGame) -> str:
    """The current state: goal offset, moves left, then each direction's status."""
    maze, position = game.maze, game.position
    # One word per direction ("DownCloser"), so each direction's status is a single token.
    around = " ".join(
        d.value.capitalize() + direction_status(maze, position, d).capitalize() for d in Direction
    )
    return f"Goal: {goal_offset(maze, position)}. Moves left: {game.moves_left}. Around: {around}."


def start_text(game: MazeGame) -> str:
    """The first user message of an episode."""
    size = game.maze.size
    return f"Maze {size}x{size}. {state_text(game)}"


def step_text(game: MazeGame, result: StepResult) -> str:
    """The tool result after a move."""
    if result.reached_goal:
        return "Reached the goal."
    head = "Moved." if result.moved else "Blocked by a wall."
    if result.out_of_moves:
        return f"{head} Out of moves."
    return f"{head} {state_text(game)}"
