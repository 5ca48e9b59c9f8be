"""Walker demonstrations for supervised warm starts (``rft sft --maze-demos N [--maze-noise P]``).

One demonstration per model call of a walked episode: the chat request the maze agent sends for that
call (system prompt, tools, and what ``keep_last_observation`` leaves: the opening observation, or
the previous move and its observation) followed by the walker's move. The requests are built with
Strands' own OpenAI formatting, so they render token for token like a real rollout, images included:
with ``observation="image"`` each observation is the map's PNG (``observation.py``), sent as an
``image_url`` part exactly as the agent sends it.

The walker takes a shortest-path move from wherever it stands, except that with probability
``noise`` it moves in a random direction instead (a wall, a step away from the goal, or by chance
the right move), until it reaches the goal or runs out of moves. ``noise=0`` is the perfect walker.
Each demonstration's call is the walker's own move (``labels="walker"``): a deliberately imperfect
teacher, which leaves reinforcement learning something to improve. With ``labels="shortest"`` the
call is the shortest-path move from the state the noisy walker reached: the walk still shows states
off the path and blocked moves, and the labels are clean. Clean labels teach the mapping from
observation to move much faster on the tiny demo model (README, "Not yet reached", has the numbers).
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any, Literal

from strands.models.openai import OpenAIModel
from strands.types.content import Message, Messages
from strands.types.tools import ToolResult, ToolResultContent, ToolUse

from agents.maze.dataset import row_maze, train_rows
from agents.maze.env import Direction, Maze, MazeGame, StepResult
from agents.maze.main import SYSTEM_PROMPT, move_tool
from agents.maze.observation import Observation, observation_kind, start_content, step_content
from agents.maze.solver import shortest_path

Labels = Literal["walker", "shortest"]
LABELS: tuple[str, ...] = ("walker", "shortest")


@cache
def _formatter() -> OpenAIModel:
    """Strands' OpenAI request formatting, built once (``agents.maze.demo.maze_exact`` formats many
    requests). Its client is never used: ``format_request`` only shapes the request body."""
    return OpenAIModel(client_args={"api_key": "unused"}, model_id="demonstration")


def _call(index: int, direction: str) -> Message:
    tool_use: ToolUse = {"toolUseId": f"call_{index}", "name": "move", "input": {"direction": direction}}
    return {"role": "assistant", "content": [{"toolUse": tool_use}]}


def _observation(index: int, content: list[ToolResultContent]) -> Message:
    result: ToolResult = {"toolUseId": f"call_{index}", "status": "success", "content": content}
    return {"role": "user", "content": [{"toolResult": result}]}


def episode_demonstrations(
    maze: Maze,
    noise: float = 0.0,
    rng: random.Random | None = None,
    observation: Observation = "text",
    labels: Labels = "walker",
) -> list[dict[str, Any]]:
    """``{"messages": [...], "tools": [...]}`` in OpenAI chat format, one per move of the walker.

    ``noise`` is the chance of a random move instead of a shortest-path one (drawn from ``rng``);
    ``observation`` what the policy sees (``text`` or ``image``); ``labels`` whose move each call
    is: the walker's (``walker``) or the shortest path's from the same state (``shortest``).
    """
    observation = observation_kind(observation)
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"noise must be between 0 and 1, got {noise}")
    if noise > 0.0 and rng is None:
        raise ValueError("a noisy walker needs rng (a random.Random) for its random moves")
    if labels not in LABELS:
        raise ValueError(f"labels must be one of {', '.join(LABELS)}, got {labels!r}")
    if shortest_path(maze) is None:
        raise ValueError("the maze has no path from start to goal")
    game = MazeGame(maze)
    demonstrations = []
    last: tuple[Direction, StepResult] | None = None
    while not game.done:
        best = (shortest_path(maze, game.position) or [])[0]
        if noise > 0.0 and rng is not None and rng.random() < noise:
            direction = rng.choice(list(Direction))
        else:
            direction = best
        context = context_after(game, last, observation)
        label = best if labels == "shortest" else direction
        demonstrations.append(call_demonstration(maze, context, label, len(game.moves)))
        last = direction, game.step(direction)
    return demonstrations


def context_after(
    game: MazeGame, last: tuple[Direction, StepResult] | None, observation: Observation = "text"
) -> Messages:
    """What the agent's next request holds after ``last`` (the move just made and its result; None at
    the start): the opening observation, or that move and its observation (``keep_last_observation``)."""
    if last is None:
        return [{"role": "user", "content": start_content(game, observation)}]
    direction, result = last
    index = len(game.moves) - 1
    return [_call(index, direction.value), _observation(index, step_content(game, result, observation))]


def call_demonstration(maze: Maze, context: Messages, direction: Direction, index: int = 0) -> dict[str, Any]:
    """The chat request the agent sends after ``context`` followed by the call that moves ``direction``:
    ``{"messages": [...], "tools": [...]}`` in OpenAI chat format."""
    tool_specs = [move_tool(MazeGame(maze)).tool_spec]
    messages = [*context, _call(index, direction.value)]
    request = _formatter().format_request(messages, tool_specs, SYSTEM_PROMPT)
    return {"messages": request["messages"], "tools": request["tools"]}


def maze_demonstrations(
    count: int,
    first_seed: int = 0,
    *,
    noise: float = 0.0,
    seed: int = 0,
    observation: Observation = "text",
    labels: Labels = "walker",
) -> list[dict[str, Any]]:
    """Demonstrations of every move on ``count`` training mazes (never the evaluation mazes).

    ``noise``: the walker's chance of a random move (see the module docstring); ``seed`` seeds them;
    ``observation``: ``text`` or ``image``; ``labels``: the walker's moves or the shortest path's.
    """
    rng = random.Random(f"maze-walker-{seed}")
    return [
        demo
        for row in train_rows(count, first_seed)
        for demo in episode_demonstrations(row_maze(row), noise, rng, observation, labels)
    ]
