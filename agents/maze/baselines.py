"""What is possible on a set of mazes: the success rate of simple walkers and of the best policy that
sees only the observation, to put a trained policy's success next to.

Stochastic walkers are scored exactly, not sampled: the chance of reaching the goal within the move
limit, by dynamic programming over (cell, moves left), averaged over the mazes. That is the success
rate an evaluation with infinitely many rollouts per maze would measure.

- ``random``: each move uniformly one of the four directions (walls included);
- ``greedy``: a direction the observation calls ``Closer`` when there is one (uniformly among them),
  else any open direction;
- ``noisy``: the walker whose walk the demo's warm start learns from: with chance ``noise`` a uniformly random
  direction, else a shortest-path move;
- ``oracle``: the shortest path (every maze is solvable within its limit, so 1.0);
- ``observation``: the best deterministic policy that maps what the observation shows (goal offset,
  moves left, the four direction words; ``render.state_text``) to a move, found by coordinate ascent
  on these same mazes: start from the shortest-path move most often right for each observation, then
  change one observation's move at a time while the number of solved mazes rises. A lower bound on
  the best observation-only policy (a stochastic one can do better in some partially observed
  cases), and fitted to the very mazes it is scored on, so optimistic for a policy that learns
  elsewhere.

    python -m agents.maze.baselines            # the 64 fixed evaluation mazes
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Callable, Sequence
from functools import cache

from agents.maze.dataset import eval_rows, row_maze
from agents.maze.env import Cell, Direction, Maze
from agents.maze.render import direction_status, goal_offset
from agents.maze.solver import shortest_path

Policy = Callable[[Maze, Cell], dict[Direction, float]]  # a move distribution at a cell
Observation = tuple[str, int, tuple[str, ...]]
DIRECTIONS = tuple(Direction)


def success_probability(maze: Maze, policy: Policy) -> float:
    """The exact chance that ``policy`` reaches the goal from the start within the move limit."""

    @cache
    def reach(cell: Cell, moves_left: int) -> float:
        if cell == maze.goal:
            return 1.0
        if moves_left == 0:
            return 0.0
        total = 0.0
        for direction, chance in policy(maze, cell).items():
            target = maze.neighbour(cell, direction)
            total += chance * reach(target if maze.is_open(target) else cell, moves_left - 1)
        return total

    return reach(maze.start, maze.move_limit)


def random_walker(maze: Maze, cell: Cell) -> dict[Direction, float]:
    return {direction: 0.25 for direction in DIRECTIONS}


def greedy_walker(maze: Maze, cell: Cell) -> dict[Direction, float]:
    statuses = {direction: direction_status(maze, cell, direction) for direction in DIRECTIONS}
    closer = [d for d, status in statuses.items() if status == "closer"]
    choices = closer or [d for d, status in statuses.items() if status != "wall"]
    return {direction: 1.0 / len(choices) for direction in choices}


def noisy_walker(noise: float) -> Policy:
    def walk(maze: Maze, cell: Cell) -> dict[Direction, float]:
        best = (shortest_path(maze, cell) or [DIRECTIONS[0]])[0]
        moves = {direction: noise / 4 for direction in DIRECTIONS}
        moves[best] += 1.0 - noise
        return moves

    return walk


def oracle_walker(maze: Maze, cell: Cell) -> dict[Direction, float]:
    return {(shortest_path(maze, cell) or [DIRECTIONS[0]])[0]: 1.0}


def observation(maze: Maze, cell: Cell, moves_left: int) -> Observation:
    """What the agent is shown at ``cell`` (``render.state_text``), as a key."""
    statuses = tuple(direction_status(maze, cell, direction) for direction in DIRECTIONS)
    return goal_offset(maze, cell), moves_left, statuses


def _walk(maze: Maze, table: dict[Observation, Direction]) -> tuple[bool, set[Observation]]:
    """Walk ``maze`` with the deterministic observation policy ``table``: (solved, observations seen)."""
    cell, seen = maze.start, set()
    for moves_left in range(maze.move_limit, 0, -1):
        key = observation(maze, cell, moves_left)
        seen.add(key)
        target = maze.neighbour(cell, table.get(key, DIRECTIONS[0]))
        cell = target if maze.is_open(target) else cell
        if cell == maze.goal:
            return True, seen
    return False, seen


def best_observation_policy(mazes: Sequence[Maze], rounds: int = 10) -> tuple[float, int]:
    """Coordinate ascent over deterministic observation -> move tables; (success rate, table size)."""
    votes: dict[Observation, Counter[Direction]] = {}
    for maze in mazes:  # every state a walker can be in: each reachable cell with each moves-left
        for cell in _reachable(maze):
            best = (shortest_path(maze, cell) or [DIRECTIONS[0]])[0]
            for moves_left in range(1, maze.move_limit + 1):
                votes.setdefault(observation(maze, cell, moves_left), Counter())[best] += 1
    table = {key: counts.most_common(1)[0][0] for key, counts in sorted(votes.items())}
    walks = [_walk(maze, table) for maze in mazes]
    for _ in range(rounds):
        improved = False
        for key in sorted(set().union(*(seen for _, seen in walks))):
            # Only the mazes whose walk shows this observation can change when its move does.
            affected = [index for index, (_, seen) in enumerate(walks) if key in seen]
            before = sum(walks[index][0] for index in affected)
            current = table[key]
            for move in DIRECTIONS:
                if move == current:
                    continue
                table[key] = move
                trial = [_walk(mazes[index], table) for index in affected]
                if sum(solved for solved, _ in trial) > before:
                    before, current, improved = sum(solved for solved, _ in trial), move, True
                    for index, walk in zip(affected, trial, strict=True):
                        walks[index] = walk
                table[key] = current
        if not improved:
            break
    return sum(solved for solved, _ in walks) / len(mazes), len(table)


def _reachable(maze: Maze) -> set[Cell]:
    seen, frontier = {maze.start}, [maze.start]
    while frontier:
        cell = frontier.pop()
        for direction in maze.open_directions(cell):
            nxt = maze.neighbour(cell, direction)
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return seen


def baselines(mazes: Sequence[Maze], noise: float = 0.3) -> dict[str, float]:
    """Success rate of each walker on ``mazes`` (see the module docstring)."""

    def mean(policy: Policy) -> float:
        return sum(success_probability(maze, policy) for maze in mazes) / len(mazes)

    return {
        "random": mean(random_walker),
        "greedy": mean(greedy_walker),
        "noisy": mean(noisy_walker(noise)),
        "oracle": mean(oracle_walker),
        "observation": best_observation_policy(mazes)[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noise", type=float, default=0.3, help="the noisy walker's random-move chance")
    args = parser.parse_args(argv)
    result = baselines([row_maze(row) for row in eval_rows()], noise=args.noise)
    print(json.dumps({name: round(value, 4) for name, value in result.items()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
