"""An agent built on AWS's own SDK (`sagemaker-train`, in its own environment, no rftkit) and a dataset
in SageMaker's format train a step under `rft train`, unchanged: the service's `prompt` column, the
SDK's signed bearer tokens (fake credentials, checked offline), its reports."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import yaml

from handlers.protocol import RolloutPayload
from handlers.smoke import BUILTIN_PAYLOAD, Outcome, smoke_url
from tests.agents.test_agent_install import free_port
from trainer.config import load_config
from trainer.errors import TrainingError
from trainer.loop import train

AGENT = Path(__file__).resolve().parent / "sagemaker_sdk" / "main.py"
FAKE_KEY_ID = "AKIAIOSFODNN7EXAMPLE"


@contextmanager
def sagemaker_agent(python: str, log_path: Path, *, credentials: bool = True) -> Iterator[str]:
    """The SDK agent on a free port, with fake AWS credentials (or none) and no AWS config files."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "PYTHONPATH"))}
    if credentials:
        env.update(
            AWS_ACCESS_KEY_ID=FAKE_KEY_ID, AWS_SECRET_ACCESS_KEY="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
        )
    env.update(
        AWS_REGION="us-west-2",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
    )
    port = free_port()
    with open(log_path, "w") as log:
        agent = subprocess.Popen(
            [python, str(AGENT), str(port)], stdout=log, stderr=subprocess.STDOUT, env=env, cwd="/"
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


def _write_run(directory: Path, model_dir: Path, agent_url: str, **policy_server: object) -> Path:
    rows = [{"question": f"What is {n} + {n}?", "answer": 2 * n} for n in range(4)]
    # The service's format: one `prompt` column holding the row as a JSON string.
    (directory / "train.jsonl").write_text(
        "".join(json.dumps({"prompt": json.dumps(r)}) + "\n" for r in rows)
    )
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
        # The SDK sends only its own tokens; the trainer's key guards the admin routes.
        "policy_server": {"api_key": "the-trainers-own-key", **policy_server},
    }
    path = directory / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_sagemaker_sdk_agent_trains_a_step_on_a_service_format_dataset(
    sagemaker_python: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    log_path = tmp_path / "agent.log"
    with sagemaker_agent(sagemaker_python, log_path) as agent_url:
        path = _write_run(
            tmp_path,
            tiny_model_dir,
            agent_url,
            accept_sagemaker_tokens=True,
            sagemaker_access_key_ids=[FAKE_KEY_ID],
        )
        summary = train(load_config(path))

    agent_log = log_path.read_text()
    (record,) = [json.loads(line) for line in (summary.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert record["rollouts"]["failed"] == 0, (record["failure_errors"], agent_log[-3000:])
    assert record["rollouts"]["total"] == 8 and record["tokens"]["sample"] > 0
    assert record["update"]["applied"] is True and summary.adapter_version == 1
    # The SDK posted both reports for every rollout, signed with its token, and none was refused.
    assert agent_log.count("CompleteRollout: trajectory_id=") == 8
    assert agent_log.count("UpdateReward: trajectory_id=") == 8
    assert "Failed /" not in agent_log and "status=401" not in agent_log


def test_without_token_mode_the_sdk_agent_is_refused_and_the_run_says_why(
    sagemaker_python: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    with sagemaker_agent(sagemaker_python, tmp_path / "agent.log") as agent_url:
        config = load_config(_write_run(tmp_path, tiny_model_dir, agent_url))
        try:
            train(config)
        except TrainingError as error:
            message = str(error)
        else:
            raise AssertionError("the run went on although every call of the agent was refused")
    assert "all 8 rollouts failed" in message and "Missing or wrong API key" in message
    # Failed by cause, the gateway's refusal shown, whatever reward the SDK's handler answered.
    assert "model_calls_refused x8, first: the gateway refused all" in message
    assert "HTTP 401: Missing or wrong API key" in message


def test_rft_smoke_tells_an_sdk_agent_without_credentials_to_get_some(
    sagemaker_python: str, tmp_path: Path
) -> None:
    payload = {**BUILTIN_PAYLOAD, "prompt": json.dumps({"question": "What is 1 + 1?", "answer": 2})}
    with sagemaker_agent(sagemaker_python, tmp_path / "agent.log", credentials=False) as agent_url:
        report = smoke_url(agent_url, RolloutPayload.model_validate(payload), timeout=60)
    assert report.outcome is Outcome.AGENT_ERROR, report.render()
    assert "No AWS credentials found" in report.observations[0]
    assert "no AWS credentials to sign with" in report.verdict
