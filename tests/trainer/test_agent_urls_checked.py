"""A wrong agent URL stops `rft train` and `rft eval` before any model loads, saying nothing listens there
(it used to load the model, then fail every evaluation rollout and send the user to the agents' logs)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
import yaml

from handlers import unreachable
from handlers.cli import main as rft
from trainer.rollouts import fanout


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("command", [["train"], ["eval", "--base"]])
def test_nothing_listening_at_an_agent_url_stops_the_run_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.setattr(fanout, "AGENT_START_GRACE_S", 1.0)  # the agent's start is waited for 1 s here
    url = _closed_port_url()
    (tmp_path / "rows.jsonl").write_text('{"prompt": "a"}\n')
    config = {
        "agents": [url],
        "train_file": "rows.jsonl",
        "eval_file": "rows.jsonl",
        "output_dir": str(tmp_path / "run"),
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    code = rft([command[0], str(tmp_path / "train.yaml"), *command[1:]])
    err = capsys.readouterr().err
    assert code in (1, 2), err
    assert f"nothing listens at {url} (connection refused), for 1 s: start the agent there" in err
    assert "checked before the model loads" in err
    assert not (tmp_path / "run" / "tiny-model").exists()  # the run's model (unset: a tiny one) never built


def test_a_listening_url_and_an_arn_pass_the_probe() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert unreachable(f"http://127.0.0.1:{listener.getsockname()[1]}") is None
    assert unreachable("arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/agent") is None


def test_a_url_reached_through_a_proxy_is_not_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fan-out's httpx goes through the environment's proxy: a direct connect would refuse a run
    # whose agents the proxy reaches.
    url = _closed_port_url()
    monkeypatch.setenv("http_proxy", "http://proxy.invalid:3128")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert unreachable(url) is None
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    assert unreachable(url) == f"nothing listens at {url} (connection refused)"


def test_an_agent_that_starts_listening_within_the_grace_is_waited_for() -> None:
    url = _closed_port_url()
    port = int(url.rsplit(":", 1)[1])
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def start_agent() -> None:  # an agent whose process takes a moment to bind its port
        listener.bind(("127.0.0.1", port))
        listener.listen()

    late = threading.Timer(0.5, start_agent)
    late.start()
    try:
        fanout.check_agents_listen([url], grace_s=30)
    finally:
        late.join()
        listener.close()
