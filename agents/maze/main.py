"""The maze agent: a Strands agent walks a grid maze with one tool, ``move``, rewarded inside the agent.

Each rollout's row names a maze (``{"seed": 17, "size": 5}``, or ``{"maze": {...}}``, or either as a
JSON string), and may choose what the model sees with ``"observation": "text"`` or ``"image"``
(default: the ``RFTKIT_MAZE_OBSERVATION`` setting, else text; see ``observation.py``): the text
observation (``render.py``) or a picture of the map (``picture.py``). The first is in the user
message, then one after every move as the tool result; each model call sees only the latest move and
observation (``keep_last_observation``). The episode ends at the goal or when the move limit is
spent; the agent then stops without another model call. The model may also stop on its own by
answering in plain text instead of calling ``move``. Reward: 1.0 only when the goal was reached
within the move limit, else 0.0 (also when the model endpoint refused to play, e.g. with a 400).
Metrics: ``solved``, ``moves`` and ``stopped`` (1.0 when the model ended the episode itself, short of
the goal with moves left: how often the policy drops the tool-call format).

Run locally with ``python -m agents.maze.main`` (port 8080), then ``rft smoke http://localhost:8080
--payload agents/maze/payloads/smoke.json``.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Literal

from strands import Agent, ToolContext, tool
from strands.agent.conversation_manager import NullConversationManager
from strands.hooks import BeforeModelCallEvent
from strands.tools.executors import SequentialToolExecutor
from strands.types.tools import AgentTool

from agents.maze.dataset import row_maze
from agents.maze.env import Maze, MazeGame
from agents.maze.observation import (
    Observation,
    default_observation,
    observation_kind,
    start_content,
    step_content,
)
from handlers import InvalidRowError, RolloutContext, ends_episode, rft_app

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = "Walk the maze to the goal."


def parse_row(row: Any) -> dict[str, Any]:
    """A row as an object: it may come as the object or as that object as a JSON string."""
    if isinstance(row, str):
        try:
            row = json.loads(row)
        except json.JSONDecodeError as error:
            raise InvalidRowError(
                f'the prompt must be a JSON object like {{"seed": 17, "size": 5}}: {error}'
            ) from error
    if not isinstance(row, dict):
        raise InvalidRowError(f'the prompt must be an object like {{"seed": 17, "size": 5}}, got {row!r}')
    return row


def parse_maze(row: Any) -> Maze:
    """The maze a row names: an object (see ``dataset.row_maze``) or that object as a JSON string."""
    try:
        return row_maze(parse_row(row))
    except ValueError as error:
        raise InvalidRowError(str(error)) from error


def parse_observation(row: Any) -> Observation:
    """What the row asks the model to see (``"observation"``), else the agent's setting."""
    fields = parse_row(row)
    if "observation" not in fields:
        return default_observation()
    try:
        return observation_kind(fields["observation"])
    except ValueError as error:
        raise InvalidRowError(str(error)) from error


def move_tool(game: MazeGame, observation: Observation = "text") -> AgentTool:
    """The ``move`` tool bound to one episode; it stops the agent once the episode is over."""

    @tool(name="move", context=True)
    def move(direction: Literal["up", "down", "left", "right"], tool_context: ToolContext) -> dict[str, Any]:
        """Move one cell."""
        if game.done:
            return {"status": "success", "content": [{"text": "The episode is over."}]}
        result = game.step(direction)
        if result.done:
            # Let the rest of this tool batch answer, then end without another model call.
            tool_context.agent.cancel(after_current_tools=True)
        return {"status": "success", "content": step_content(game, result, observation)}

    return move


def keep_last_observation(event: BeforeModelCallEvent) -> None:
    """Before each model call, drop all but the last move and its observation.

    The observation is the whole state the policy needs (goal offset, moves left, what each
    direction does), so earlier turns add nothing but tokens; and a small policy reads its one
    observation far more easily than it finds the newest one in a growing transcript. Each call's
    prompt then no longer extends the previous one, so the trainer keeps one sequence per call.
    """
    messages = event.agent.messages
    if len(messages) > 2:
        del messages[:-2]


def build_agent(game: MazeGame, model: Any, observation: Observation = "text") -> Agent:
    """The Strands agent that plays ``game`` through ``model``, showing it ``observation``s."""
    return Agent(
        model=model,
        tools=[move_tool(game, observation)],
        system_prompt=SYSTEM_PROMPT,
        hooks=[keep_last_observation],
        conversation_manager=NullConversationManager(),
        # Moves in one batch are played in order, not concurrently.
        tool_executor=SequentialToolExecutor(),
        callback_handler=None,
    )


async def rollout(row: Any, ctx: RolloutContext) -> dict[str, Any]:
    """Play one maze against the policy and return its reward with a few metrics."""
    game, observation = MazeGame(parse_maze(row)), parse_observation(row)
    agent = build_agent(game, ctx.strands_model(), observation)
    try:
        await agent.invoke_async(start_content(game, observation))
    except Exception as error:
        if not ends_episode(error):
            raise
        logger.info("rollout %s ended by the model endpoint: %s", ctx.rollout_id, error)
    logger.info(
        "rollout %s: %s after %d of %d moves",
        ctx.rollout_id,
        "goal" if game.reached_goal else "no goal",
        len(game.moves),
        game.maze.move_limit,
    )
    return {
        "reward": game.reward,
        # stopped: the episode ended with moves left short of the goal (a plain-text answer or a
        # malformed tool call), as opposed to running out of moves.
        "metrics": {"solved": game.reward, "moves": float(len(game.moves)), "stopped": float(not game.done)},
    }


app = rft_app(rollout, row_format="json")

if __name__ == "__main__":
    app.run()
