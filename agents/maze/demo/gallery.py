"""``rft demo``'s episode gallery: what the policy saw and did on a few evaluation mazes.

After each evaluation (an ``EvaluationHook`` of ``trainer.loop.train``), the first rollout on each of
the first few evaluation mazes is replayed from its trace: the moves are the ``move`` calls the
policy sampled (its completion tokens, decoded and parsed as the policy server parses them), played
on the row's maze; the frames are the map drawn by the maze agent's own renderer, i.e. exactly the
pictures an image-observing policy was shown. Each episode becomes one PNG strip in
``run_dir/gallery/step-NNN/``; in MLflow each gets its strip, its frames and a ``moves.json`` under
``episodes/step-N/maze-NN/``.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents.maze.env import Direction
from agents.maze.gallery import Episode, episode_frames, strip_png
from agents.maze.main import parse_maze
from policy_server import RolloutTrace
from policy_server.http import parse_tool_calls
from trainer.ops import MetricsLogger
from trainer.rollouts import PlayedRollout

log = logging.getLogger(__name__)
DIRECTIONS = {direction.value for direction in Direction}


def trace_moves(trace: RolloutTrace, decode: Callable[[list[int]], str]) -> list[str]:
    """The directions of the valid ``move`` calls the policy sampled, in order."""
    moves = []
    for call in trace.calls:
        _, tool_calls = parse_tool_calls(decode(call.completion_token_ids))
        for tool_call in tool_calls:
            function = tool_call["function"]
            direction = json.loads(function["arguments"]).get("direction")
            if function["name"] == "move" and direction in DIRECTIONS:
                moves.append(direction)
    return moves


class EpisodeGallery:
    """The hook: strips of the first rollout on each of the first ``mazes`` evaluation rows."""

    def __init__(self, run_dir: Path, decode: Callable[[list[int]], str], mazes: int = 4) -> None:
        self.run_dir = Path(run_dir)
        self.decode = decode
        self.mazes = mazes
        self.strips: list[Path] = []

    def __call__(self, step: int, played: list[PlayedRollout], metrics: MetricsLogger) -> None:
        shown: set[int] = set()
        for rollout in played:  # request order: a row's first generation comes first
            index = rollout.request.group_index
            if index >= self.mazes or index in shown or not rollout.outcome.ok:
                continue
            shown.add(index)
            self._save(step, index, rollout, metrics)

    def _save(self, step: int, index: int, rollout: PlayedRollout, metrics: MetricsLogger) -> None:
        outcome = rollout.outcome
        moves = trace_moves(rollout.trace, self.decode)
        episode = episode_frames(
            parse_maze(rollout.request.row), moves, stopped=outcome.metrics.get("stopped") == 1.0
        )
        played_moves = len(episode.frames) - 1
        if outcome.metrics.get("moves") not in (None, float(played_moves)):
            log.warning(
                "gallery: maze %d at step %d: the agent counted %s moves, its trace replays %d",
                index,
                step,
                outcome.metrics.get("moves"),
                played_moves,
            )
        title = f"step {step}, maze {index}: reward {outcome.reward:g}"
        strip = self.run_dir / "gallery" / f"step-{step:03d}" / f"maze-{index:02d}.png"
        strip.parent.mkdir(parents=True, exist_ok=True)
        strip.write_bytes(strip_png(episode, title))
        self.strips.append(strip)
        _log_episode(metrics, f"episodes/step-{step}/maze-{index:02d}", strip, episode, moves, outcome.reward)


def _log_episode(
    metrics: MetricsLogger, artifact_path: str, strip: Path, episode: Episode, moves: list[str], reward: Any
) -> None:
    """The strip, every frame and the moves as one MLflow artifact directory."""
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        (folder / "strip.png").write_bytes(strip.read_bytes())
        for number, frame in enumerate(episode.frames):
            (folder / f"frame-{number:02d}.png").write_bytes(frame)
        summary = {"moves": moves, "labels": episode.labels, "reward": reward, "solved": episode.reached_goal}
        (folder / "moves.json").write_text(json.dumps(summary, indent=2) + "\n")
        metrics.log_artifact(folder, artifact_path)
