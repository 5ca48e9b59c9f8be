"""What the policy is shown, as Strands content blocks: the text observation or the picture.

``text`` (the default) is ``render.py``'s observation as it always was. ``image`` is the map as a PNG
(``picture.py``) with one short line of text that the picture cannot show: the maze's size at the
start, then what the last move did and how many moves are left. The opening observation is the user
message; each later one is the ``move`` tool's result, so Strands' OpenAI formatting sends its
picture as an image part of a user message right after the tool message (OpenAI takes images only
from users). Same tool, same reward, same episode either way.

A row chooses with ``"observation": "image"``; otherwise the agent's setting does (the
``RFTKIT_MAZE_OBSERVATION`` environment variable, ``text`` when unset).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Literal, cast, get_args

from strands.types.content import ContentBlock
from strands.types.media import ImageContent
from strands.types.tools import ToolResultContent

from agents.maze.env import MazeGame, StepResult
from agents.maze.picture import IMAGE_FORMAT, game_png
from agents.maze.render import start_text, step_text

Observation = Literal["text", "image"]
OBSERVATIONS: tuple[str, ...] = get_args(Observation)
OBSERVATION_ENV = "RFTKIT_MAZE_OBSERVATION"


def _not_image_moves(record: logging.LogRecord) -> bool:
    return "Moving image from tool message" not in record.getMessage()


# Strands warns on every tool result that carries an image (it moves the image into a user message,
# as OpenAI requires): for the image observation that is every move, by design, so say nothing.
logging.getLogger("strands.models.openai").addFilter(_not_image_moves)


def observation_kind(value: Any) -> Observation:
    """``value`` as an observation kind; a ``ValueError`` naming the choices otherwise."""
    if value not in OBSERVATIONS:
        raise ValueError(f"observation must be one of {', '.join(OBSERVATIONS)}, got {value!r}")
    return cast(Observation, value)


def default_observation() -> Observation:
    """The agent's setting: ``RFTKIT_MAZE_OBSERVATION``, ``text`` when unset."""
    try:
        return observation_kind(os.environ.get(OBSERVATION_ENV, "text"))
    except ValueError as error:
        raise ValueError(f"{OBSERVATION_ENV}: {error}") from error


def image_content(game: MazeGame) -> ImageContent:
    """The episode's current state as Strands image content."""
    return {"format": IMAGE_FORMAT, "source": {"bytes": game_png(game)}}


def start_content(game: MazeGame, observation: Observation) -> list[ContentBlock]:
    """The opening user message's content."""
    if observation == "text":
        return [{"text": start_text(game)}]
    size = game.maze.size
    return [{"text": f"Maze {size}x{size}. Moves left: {game.moves_left}."}, {"image": image_content(game)}]


def step_content(game: MazeGame, result: StepResult, observation: Observation) -> list[ToolResultContent]:
    """The ``move`` tool's result after a move: text only once the episode is over."""
    if observation == "text" or result.done:
        return [{"text": step_text(game, result)}]
    head = "Moved." if result.moved else "Blocked by a wall."
    return [{"text": f"{head} Moves left: {game.moves_left}."}, {"image": image_content(game)}]
