"""A rollout that never reached the model is a failed rollout by cause, never a reward: its calls
refused at the gateway (a wrong key, the agent swallowing the 401 and answering its no-play reward),
or no call made at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.letters.run_files import serving, write_run_files
from tests.trainer.agent_apps.swallowing import modelless_app, swallowing_app
from trainer import cli

KEY_REFUSAL = "HTTP 401: Missing or wrong API key: send the header 'Authorization: Bearer <key>'."


def _record(run: Path) -> dict:
    (record,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return record


def test_an_agent_swallowing_its_401s_fails_every_rollout_by_cause_with_the_refusal_shown(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving(swallowing_app("not-the-key")) as agent_url:
        path = write_run_files(
            tmp_path,
            tiny_model_dir,
            agent_url,
            max_steps=2,
            eval_file=None,
            policy_server={"api_key": "the-run-key"},
        )
        code = cli.main([str(path)])

    assert code == 1
    console = capsys.readouterr().err
    assert "step 1: all 8 rollouts failed" in console and "model_calls_refused x8" in console
    assert KEY_REFUSAL in console
    assert ".." not in console  # the refusal's own period is not doubled by the sentence after it
    record = _record(tmp_path / "run")
    assert record["rollouts"]["failed"] == 8 and record["failures"]["model_calls_refused"] == 8
    assert KEY_REFUSAL in record["failure_errors"]["model_calls_refused"]
    assert record["failures"]["no_model_calls"] == 0


def test_an_agent_that_never_calls_the_model_fails_every_rollout_as_no_model_calls(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving(modelless_app()) as agent_url:
        path = write_run_files(tmp_path, tiny_model_dir, agent_url, max_steps=2, eval_file=None)
        code = cli.main([str(path)])

    assert code == 1
    assert "no_model_calls x8" in capsys.readouterr().err
    record = _record(tmp_path / "run")
    assert record["failures"]["no_model_calls"] == 8 and record["rollouts"]["failed"] == 8
    assert "without calling the model" in record["failure_errors"]["no_model_calls"]
