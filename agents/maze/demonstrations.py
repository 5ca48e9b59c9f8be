"""Shortest-path demonstrations for supervised warm starts (``rft sft --maze-demos N``).

Each demonstration is the chat request the maze agent would send for its last model call on a
perfectly played episode (system prompt, tools, the opening observation, every move and its
observation), built with Strands' own OpenAI formatting so it renders token for token like a real
rollout.
"""

from __future__ import annotations

from typing import Any

from strands.models.openai import OpenAIModel
from strands.types.content import Messages

from agents.maze.dataset import row_maze, train_rows
from agents.maze.env import Maze, MazeGame
from agents.maze.main import SYSTEM_PROMPT, move_tool
from agents.maze.render import start_text, step_text
from agents.maze.solver import shortest_path


def demonstration(maze: Maze) -> dict[str, Any]:
    """``{"messages": [...], "tools": [...]}`` in OpenAI chat format: one shortest-path episode."""
    path = shortest_path(maze)
    if path is None:
        raise ValueError("the maze has no path from start to goal")
    game = MazeGame(maze)
    messages: Messages = [{"role": "user", "content": [{"text": start_text(game)}]}]
    for index, direction in enumerate(path):
        call_id = f"call_{index}"
        messages.append(
            {
                "role": "assistant",
                "content": [{"toolUse": {"toolUseId": call_id, "name": "move", "input": {"direction": direction.value}}}],
            }
        )
        result = game.step(direction)
        if result.done:
            break
        messages.append(
            {
                "role": "user",
                "content": [
                    {"toolResult": {"toolUseId": call_id, "status": "success", "content": [{"text": step_text(game, result)}]}}
                ],
            }
        )
    # The client is never used: format_request only shapes the request body.
    model = OpenAIModel(client_args={"api_key": "unused"}, model_id="demonstration")
    request = model.format_request(messages, [move_tool(MazeGame(maze)).tool_spec], SYSTEM_PROMPT)
    return {"messages": request["messages"], "tools": request["tools"]}


def maze_demonstrations(count: int, first_seed: int = 0) -> list[dict[str, Any]]:
    """Demonstrations on ``count`` training mazes (never the evaluation mazes)."""
    return [demonstration(row_maze(row)) for row in train_rows(count, first_seed)]
