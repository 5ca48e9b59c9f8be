"""Shortest-path demonstrations for supervised warm starts (``rft sft --maze-demos N``).

One demonstration per model call of a perfectly played episode: the chat request the maze agent
sends for that call (system prompt, tools, and what ``keep_last_observation`` leaves: the opening
observation, or the previous move and its observation) followed by the right move. The requests
are built with Strands' own OpenAI formatting, so they render token for token like a real rollout.
"""

from __future__ import annotations

from typing import Any

from strands.models.openai import OpenAIModel
from strands.types.content import Message, Messages

from agents.maze.dataset import row_maze, train_rows
from agents.maze.env import Maze, MazeGame
from agents.maze.main import SYSTEM_PROMPT, move_tool
from agents.maze.render import start_text, step_text
from agents.maze.solver import shortest_path


def _call(index: int, direction: str) -> Message:
    tool_use = {"toolUseId": f"call_{index}", "name": "move", "input": {"direction": direction}}
    return {"role": "assistant", "content": [{"toolUse": tool_use}]}


def _observation(index: int, text: str) -> Message:
    result = {"toolUseId": f"call_{index}", "status": "success", "content": [{"text": text}]}
    return {"role": "user", "content": [{"toolResult": result}]}


def episode_demonstrations(maze: Maze) -> list[dict[str, Any]]:
    """``{"messages": [...], "tools": [...]}`` in OpenAI chat format, one per move of a shortest path."""
    path = shortest_path(maze)
    if path is None:
        raise ValueError("the maze has no path from start to goal")
    game = MazeGame(maze)
    # The client is never used: format_request only shapes the request body.
    model = OpenAIModel(client_args={"api_key": "unused"}, model_id="demonstration")
    tool_specs = [move_tool(MazeGame(maze)).tool_spec]
    context: Messages = [{"role": "user", "content": [{"text": start_text(game)}]}]
    demonstrations = []
    for index, direction in enumerate(path):
        move = _call(index, direction.value)
        request = model.format_request([*context, move], tool_specs, SYSTEM_PROMPT)
        demonstrations.append({"messages": request["messages"], "tools": request["tools"]})
        result = game.step(direction)
        context = [move, _observation(index, step_text(game, result))]
    return demonstrations


def maze_demonstrations(count: int, first_seed: int = 0) -> list[dict[str, Any]]:
    """Demonstrations of every move on ``count`` training mazes (never the evaluation mazes)."""
    return [demo for row in train_rows(count, first_seed) for demo in episode_demonstrations(row_maze(row))]
