"""An episode as one picture: every state the policy saw, side by side, each with the move it made.

``episode_frames`` replays moves on the maze and draws each state with ``picture.py``, the renderer
the agent's image observation uses, so the frames are the very PNGs an image-observing policy was
shown (the environment and the renderer are deterministic). ``strip_png`` lays them out left to right,
enlarged, with the move under each frame and how the episode ended under the last.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

from agents.maze.env import Direction, Maze, MazeGame
from agents.maze.picture import game_png

SCALE = 4  # frames are enlarged this much in the strip, so a person can see them
GAP_PX = 6
LABEL_PX = 14
BACKGROUND = (235, 235, 235)
INK = (0, 0, 0)


@dataclass(frozen=True)
class Episode:
    """The states of a replayed episode and the label under each (the move made, or how it ended)."""

    frames: list[bytes]
    labels: list[str]
    reached_goal: bool


def episode_frames(maze: Maze, moves: Sequence[Direction | str], *, stopped: bool = False) -> Episode:
    """Replay ``moves`` from the start; moves after the episode ended are ignored.

    ``stopped``: the policy ended the episode itself (a plain answer or a malformed call).
    """
    game = MazeGame(maze)
    frames, labels = [game_png(game)], []
    for move in moves:
        if game.done:
            break
        result = game.step(move)
        labels.append(Direction(move).value + ("" if result.moved else " (wall)"))
        frames.append(game_png(game))
    if game.reached_goal:
        labels.append("goal")
    elif game.moves_left <= 0:
        labels.append("out of moves")
    else:
        labels.append("stopped" if stopped else "-")
    return Episode(frames, labels, game.reached_goal)


def strip_png(episode: Episode, title: str = "") -> bytes:
    """The frames left to right, enlarged ``SCALE`` times, each labelled; ``title`` on top."""
    from PIL import Image, ImageDraw

    images = [Image.open(io.BytesIO(frame)).convert("RGB") for frame in episode.frames]
    side = max(image.width for image in images) * SCALE
    top = LABEL_PX if title else 0
    width = len(images) * (side + GAP_PX) + GAP_PX
    strip = Image.new("RGB", (max(width, 8 * len(title)), top + side + LABEL_PX + 2 * GAP_PX), BACKGROUND)
    draw = ImageDraw.Draw(strip)
    if title:
        draw.text((GAP_PX, 2), title, fill=INK)
    for index, (image, label) in enumerate(zip(images, episode.labels, strict=True)):
        left = GAP_PX + index * (side + GAP_PX)
        enlarged = image.resize((image.width * SCALE, image.height * SCALE), Image.Resampling.NEAREST)
        strip.paste(enlarged, (left, top + GAP_PX))
        draw.text((left, top + GAP_PX + side + 2), label, fill=INK)
    buffer = io.BytesIO()
    strip.save(buffer, format="PNG")
    return buffer.getvalue()
