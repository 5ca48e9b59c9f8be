"""The two most used agent frameworks besides Strands drive a tool-calling agent through rftkit
unchanged, each from the frameworks environment (`.venv-frameworks`), wrapped with ``rft_app``:

- the OpenAI Agents SDK (``OpenAIChatCompletionsModel`` over ``AsyncOpenAI(base_url, default_headers)``)
- LangGraph (``create_react_agent`` over langchain-openai's ``ChatOpenAI(base_url, default_headers)``)

The tool round trip (the model calls ``add``, the framework runs it and sends the result back) is
checked against the scripted model, since the tiny test model cannot call tools; one ``rft train``
step through each agent, its rows alternating streaming and not, checks the real policy server.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from handlers.protocol import JOB_ARN_HEADER
from handlers.serving import serve_in_thread
from tests.agents.test_agent_install import free_port
from tests.scripted_model import ScriptedModel, text, tool
from trainer.config import load_config
from trainer.loop import train

REPO_ROOT = Path(__file__).resolve().parents[2]
APPS = Path(__file__).resolve().parent / "frameworks"
FRAMEWORKS = ["openai_agents", "langgraph"]
JOB = "arn:aws:sagemaker:us-west-2:111122223333:training-job/frameworks"


@contextmanager
def framework_agent(python: str, framework: str, log_path: Path) -> Iterator[str]:
    """The framework's ``rft_app`` agent on a free port, importing this checkout's rftkit."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OPENAI_AGENTS_DISABLE_TRACING": "1"}
    port = free_port()
    with open(log_path, "w") as log:
        agent = subprocess.Popen(
            [python, str(APPS / f"{framework}_app.py"), str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd="/",
        )
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and agent.poll() is None:
                try:
                    if httpx.get(f"{url}/ping", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            assert agent.poll() is None, log_path.read_text()[-3000:]
            yield url
        finally:
            agent.terminate()
            agent.wait(timeout=30)


def _payload(rollout_id: str, endpoint: str, stream: bool) -> dict[str, Any]:
    return {
        "prompt": {"question": "What is 2 + 3?", "answer": 5, "stream": stream},
        "metadata": {"jobArn": JOB, "rolloutId": rollout_id, "endpoint": endpoint},
        "inferenceParams": {"temperature": 0.0, "maxTokens": 32},
    }


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_each_framework_runs_the_tool_round_trip_streaming_and_not(
    frameworks_python: str, framework: str, tmp_path: Path
) -> None:
    model = ScriptedModel()
    log_path = tmp_path / "agent.log"
    with (
        serve_in_thread(model.app()) as model_url,
        framework_agent(frameworks_python, framework, log_path) as agent_url,
    ):
        for stream in (False, True):
            rollout_id = f"{framework}-{'stream' if stream else 'json'}"
            model.scripts[rollout_id] = [tool("add", a=2, b=3), text("The answer is 5.")]
            answer = httpx.post(
                f"{agent_url}/invocations", json=_payload(rollout_id, model_url, stream), timeout=120
            )
            assert answer.status_code == 200, (answer.text, log_path.read_text()[-3000:])
            assert answer.json()["reward"] == 1.0, answer.json()

            first, second = model.bodies(rollout_id)
            assert bool(first.get("stream")) is stream and bool(second.get("stream")) is stream
            assert [t["function"]["name"] for t in first["tools"]] == ["add"]
            assert 32 in (first.get("max_tokens"), first.get("max_completion_tokens")), first
            # The framework ran the tool and sent its result back after the assistant's call.
            call_turn = next(m for m in second["messages"] if m["role"] == "assistant")
            assert call_turn["tool_calls"][0]["function"]["name"] == "add"
            result = next(m for m in second["messages"] if m["role"] == "tool")
            assert result["tool_call_id"] == call_turn["tool_calls"][0]["id"] and result["content"] == "5"
            calls = [call for call in model.calls if call.rollout[1] == rollout_id]
            assert all(call.headers[JOB_ARN_HEADER.lower()] == JOB for call in calls)


def _write_run(directory: Path, model_dir: Path, agent_url: str) -> Path:
    rows = [{"question": f"What is {n} + {n}?", "answer": 2 * n, "stream": n % 2 == 0} for n in range(4)]
    (directory / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = {
        "model": str(model_dir),
        "agents": [agent_url],
        "train_file": "train.jsonl",
        "num_generations": 4,
        "rows_per_step": 2,
        "max_steps": 1,
        "max_completion_length": 12,
        "learning_rate": 5e-3,
        "lora": {"r": 4, "lora_alpha": 8},
        "rollout_timeout_s": 120,
        "max_retries": 0,
        "output_dir": "run",
        "seed": 5,
        "policy_server": {"api_key": "agents-key"},
    }
    path = directory / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_each_framework_agent_trains_a_step(
    frameworks_python: str, framework: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    log_path = tmp_path / "agent.log"
    with framework_agent(frameworks_python, framework, log_path) as agent_url:
        summary = train(load_config(_write_run(tmp_path, tiny_model_dir, agent_url)))

    (record,) = [json.loads(line) for line in (summary.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert record["rollouts"]["total"] == 8
    assert record["rollouts"]["failed"] == 0, (record["failure_errors"], log_path.read_text()[-3000:])
    assert record["tokens"]["sample"] > 0
