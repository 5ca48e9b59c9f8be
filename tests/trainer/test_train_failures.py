"""A new user's first run: the template agent on a dataset in SageMaker's format, and runs whose
rollouts all fail, which must stop with the agents' error text instead of finishing "successfully"."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from agents.letters.run_files import serving, write_run_files
from agents.template.main import NO_PLAY_REWARD, SOLVED_REWARD, TRUNCATED_REWARD
from agents.template.main import app as template_app
from handlers import RolloutContext, rft_app
from trainer import cli
from trainer.config import load_config
from trainer.errors import TrainingError
from trainer.loop import train
from trainer.ops import status


def _service_rows(count: int) -> str:
    """Arithmetic rows as SageMaker's service stores them: only a `prompt` column, a JSON string."""
    rows = [{"question": f"What is {n} + {n + 1}?", "answer": 2 * n + 1} for n in range(count)]
    return "".join(json.dumps({"prompt": json.dumps(row)}) + "\n" for row in rows)


def test_the_template_agent_trains_on_service_format_rows_with_truncated_episodes_scored(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # The tiny model rarely stops within 12 tokens: Strands raises MaxTokensReachedException, which the
    # template must score (it answered 500 before, and every rollout failed as agent_error).
    with serving(template_app) as agent_url:
        path = write_run_files(
            tmp_path, tiny_model_dir, agent_url, max_steps=2, rows_per_step=4, eval_file=None
        )
        (tmp_path / "train.jsonl").write_text(_service_rows(16))
        summary = train(load_config(path))

    records = [json.loads(line) for line in (summary.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [1, 2]
    for record in records:
        assert record["rollouts"]["total"] == 16
        assert record["rollouts"]["failed"] == 0, record["failure_errors"]
        assert record["failure_errors"] == {}
        # Rewards are the template's own levels: no row was refused as unreadable.
        assert TRUNCATED_REWARD <= record["reward_mean"] <= SOLVED_REWARD
        assert record["reward_mean"] > NO_PLAY_REWARD


def _crashing_app(message: str) -> Any:
    async def rollout(row: Any, ctx: RolloutContext) -> float:
        raise RuntimeError(message)

    return rft_app(rollout)


def test_a_run_whose_rollouts_all_fail_stops_at_once_with_the_error_text(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = "the environment crashed: no tool named calculate"
    with serving(_crashing_app(message)) as agent_url:
        path = write_run_files(tmp_path, tiny_model_dir, agent_url, max_steps=3, eval_file=None)
        code = cli.main([str(path)])

    assert code == 1
    console = capsys.readouterr().err
    assert (
        "step 1: all 8 rollouts failed" in console
        and f"agent_error x8, first: HTTP 500: RuntimeError: {message}" in console
    )
    run = tmp_path / "run"
    (record,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert record["rollouts"]["failed"] == 8 and record["failures"]["agent_error"] == 8
    # The failure names the dataset row it played, in the record and on the console.
    (error,) = record["failure_errors"].values()
    assert re.fullmatch(rf"HTTP 500: RuntimeError: {message} \(train\.jsonl row \d+\)", error), error
    assert error in console
    log = (run / "train.log").read_text()
    assert f"HTTP 500: RuntimeError: {message}" in log
    # The line that stops the run reaches the run's log too, once, and once on the console.
    assert log.count("step 1: all 8 rollouts failed, so there is nothing to train on") == 1
    assert console.count("step 1: all 8 rollouts failed") == 1
    # A text run leaves no empty images/ directory behind.
    assert not (run / "images").exists()
    # Both groups say why they give no gradient, with the text, not "0 valid rollout(s) of 0".
    assert log.count("only 0 valid rollout(s) of 4 (agent_error x4, first: HTTP 500: ") == 2
    assert not (run / "checkpoints").exists()


def test_an_evaluation_whose_rollouts_all_fail_stops_the_run_before_training(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    with serving(_crashing_app("No AWS credentials found")) as agent_url:
        config = load_config(write_run_files(tmp_path, tiny_model_dir, agent_url))
        with pytest.raises(
            TrainingError, match=r"evaluation at step 0: all 2 rollouts failed: agent_error x2"
        ) as stopped:
            train(config)
    # What the evaluation recorded stays in metrics.jsonl, as strict JSON (no bare NaN).
    lines = (config.output_dir / "metrics.jsonl").read_text().splitlines()
    (record,) = [json.loads(line, parse_constant=_refuse_constant) for line in lines]
    assert record["step"] == 0 and record["stopped"] == str(stopped.value)
    assert record["eval"]["failed"] == 2 and record["eval"]["failures"] == {"agent_error": 2}
    assert record["eval"]["mean_reward"] is None
    assert "(eval.jsonl row 1)" in record["eval"]["failure_errors"]["agent_error"]
    assert str(stopped.value) in (config.output_dir / "train.log").read_text()
    assert status.render(status.read_status(config.output_dir)) == (
        f"the run stopped at step 0: {stopped.value}"
    )


def _refuse_constant(name: str) -> Any:
    raise AssertionError(f"metrics.jsonl holds a bare {name}, which strict JSON readers refuse")
