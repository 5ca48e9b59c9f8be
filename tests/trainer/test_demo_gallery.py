"""The demo's episode gallery: an evaluation rollout's sampled moves, decoded from its trace, replayed
on its maze into a PNG strip in the run directory and, with every frame and the moves, into MLflow."""

from __future__ import annotations

import io
import json
from pathlib import Path

from mlflow.tracking import MlflowClient
from PIL import Image

from agents.maze.dataset import eval_rows, row_maze
from agents.maze.demo.gallery import EpisodeGallery, trace_moves
from agents.maze.env import MazeGame
from agents.maze.picture import game_png
from agents.maze.solver import shortest_path
from policy_server.models.chat_templates import load_tokenizer
from policy_server.trace import CallRecord, RolloutTrace
from trainer.ops.metrics import MetricsLogger
from trainer.rollouts.fanout import RolloutRequest
from trainer.rollouts.outcomes import RolloutOutcome
from trainer.rollouts.producer import PlayedRollout

ROW = eval_rows()[1]


def _call(tokenizer, index: int, text: str) -> CallRecord:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return CallRecord(
        index=index,
        prompt_token_ids=[1],
        completion_token_ids=ids,
        completion_logprobs=[0.0] * len(ids),
        adapter_version=1,
        finish_reason="tool_calls",
        started_at=0.0,
        finished_at=0.0,
    )


def _move(direction: str) -> str:
    return f'<tool_call>\n{{"name": "move", "arguments": {{"direction": "{direction}"}}}}\n</tool_call>'


def _played(tokenizer, group_index: int, texts: list[str], moves: int) -> PlayedRollout:
    rollout_id = f"eval-0-{group_index}"
    trace = RolloutTrace(
        job_arn="job", rollout_id=rollout_id, calls=[_call(tokenizer, i, t) for i, t in enumerate(texts)]
    )
    request = RolloutRequest(
        row=json.dumps(ROW), rollout_id=rollout_id, group_index=group_index, job_arn="job", endpoint=""
    )
    outcome = RolloutOutcome(
        rollout_id=rollout_id,
        group_index=group_index,
        status="ok",
        reward=1.0,
        metrics={"moves": float(moves), "stopped": 0.0},
    )
    return PlayedRollout(request, outcome, trace)


def test_the_sampled_moves_become_a_strip_and_mlflow_artifacts(tiny_model_dir: Path, tmp_path: Path) -> None:
    tokenizer = load_tokenizer(tiny_model_dir, None)
    path = [direction.value for direction in shortest_path(row_maze(ROW)) or []]
    # One call with a malformed block and a move into nowhere, then the path one call per move.
    texts = ['<tool_call>{"name": "move"</tool_call>' + _move("sideways"), *map(_move, path)]
    played = _played(tokenizer, 0, texts, len(path))
    assert trace_moves(played.trace, tokenizer.decode) == path

    metrics = MetricsLogger(tmp_path / "run", tracking_uri=f"file:{tmp_path / 'mlruns'}")
    gallery = EpisodeGallery(tmp_path / "run", tokenizer.decode, mazes=1)
    # Only the first rollout of each of the first `mazes` rows is drawn.
    gallery(0, [played, _played(tokenizer, 0, [], 0), _played(tokenizer, 1, [], 0)], metrics)
    metrics.close()

    strip_path = tmp_path / "run" / "gallery" / "step-000" / "maze-00.png"
    assert gallery.strips == [strip_path]
    strip = Image.open(io.BytesIO(strip_path.read_bytes()))
    assert strip.width > (len(path) + 1) * row_maze(ROW).size * 8 * 4  # every frame, enlarged
    client = MlflowClient(tracking_uri=f"file:{tmp_path / 'mlruns'}")
    folder = "episodes/step-0/maze-00"
    names = sorted(Path(a.path).name for a in client.list_artifacts(metrics.mlflow_run_id, folder))
    assert names == sorted(["strip.png", "moves.json", *(f"frame-{n:02d}.png" for n in range(len(path) + 1))])
    moves = json.loads(
        Path(client.download_artifacts(metrics.mlflow_run_id, f"{folder}/moves.json")).read_text()
    )
    assert moves["moves"] == path and moves["solved"] is True and moves["labels"][-1] == "goal"
    # The frames are the pictures the agent's image observation shows at each state.
    game = MazeGame(row_maze(ROW))
    first = Path(client.download_artifacts(metrics.mlflow_run_id, f"{folder}/frame-00.png")).read_bytes()
    assert first == game_png(game)
