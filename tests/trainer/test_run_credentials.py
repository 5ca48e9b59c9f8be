"""No one uses the policy who was not given it: a run draws a fresh key for its agents unless the config
names one or `none`, never logs it in full, and a reachable host with no credential check is refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agents.letters.run_files import serving, write_run_files
from tests.trainer.agent_apps.swallowing import swallowing_app
from trainer import cli
from trainer.config import ConfigError, TrainConfig, load_config

# The shape of the key a run draws (rft- and 32 URL-safe characters).
FRESH_KEY = re.compile(r"rft-[A-Za-z0-9_-]{32}")


def _config(tmp_path: Path, *overrides: str) -> TrainConfig:
    path = tmp_path / "train.yaml"
    path.write_text("agents: [http://127.0.0.1:9001]\n")
    return load_config(path, list(overrides))


def test_the_key_agents_get_fresh_by_default_named_or_none(tmp_path: Path) -> None:
    settings = _config(tmp_path).policy_server
    first, second = settings.agents_key(), settings.agents_key()
    assert first is not None and FRESH_KEY.fullmatch(first) and first != second
    assert _config(tmp_path, "policy_server.api_key=mine").policy_server.agents_key() == "mine"
    assert _config(tmp_path, "policy_server.api_key=none").policy_server.agents_key() is None
    # A fresh key guards a reachable host, so it needs nothing more.
    assert _config(tmp_path, "policy_server.host=0.0.0.0").policy_server.agents_key() is not None


def test_a_reachable_host_without_any_credential_check_is_refused_unless_told_so(tmp_path: Path) -> None:
    unguarded = ["policy_server.host=0.0.0.0", "policy_server.api_key=none"]
    with pytest.raises(ConfigError) as caught:
        _config(tmp_path, *unguarded)
    message = str(caught.value)
    assert "refusing to serve on 0.0.0.0 without any credential check" in message
    assert "policy_server.allow_unauthenticated_network: true" in message
    _config(tmp_path, *unguarded, "policy_server.allow_unauthenticated_network=true")
    _config(tmp_path, *unguarded, "policy_server.accept_sagemaker_tokens=true")
    with pytest.raises(ConfigError, match="api_key: String should have at least 1 character"):
        _config(tmp_path, "policy_server.api_key=''")


def test_a_run_refuses_an_agent_that_drops_the_fresh_key_and_never_logs_the_key(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving(swallowing_app(None)) as agent_url:
        path = write_run_files(tmp_path, tiny_model_dir, agent_url, max_steps=1, eval_file=None)
        code = cli.main([str(path)])

    assert code == 1
    assert "model_calls_refused x8" in capsys.readouterr().err
    run = tmp_path / "run"
    log = (run / "train.log").read_text()
    assert "agents' credential: a fresh key for this run (rft-" in log
    for name in ("train.log", "metrics.jsonl", "config.json"):
        assert not FRESH_KEY.search((run / name).read_text()), name


def test_api_key_none_takes_calls_without_a_key(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving(swallowing_app(None)) as agent_url:
        unguarded = {"api_key": "none"}
        path = write_run_files(
            tmp_path, tiny_model_dir, agent_url, max_steps=1, eval_file=None, policy_server=unguarded
        )
        code = cli.main([str(path)])

    assert code == 0, capsys.readouterr().err
    (record,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert record["rollouts"]["failed"] == 0
    log = (tmp_path / "run" / "train.log").read_text()
    assert "agents' credential: none (policy_server.api_key: none)" in log
