"""``rft serve``: a real process serving the tiny model, called with the headers it prints."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER
from policy_server.cli import main

JOB = "arn:local:job/dev"


def test_serve_opens_a_job_for_interactive_use(tiny_model_dir: Path) -> None:
    command = [sys.executable, "-u", "-m", "handlers.cli", "serve", "--model", str(tiny_model_dir)]
    command += ["--engine", "hf", "--port", "0", "--open-job", JOB, "--max-tokens", "8", "--api-key", "k"]
    # Started with SIGINT ignored, as a background job of a non-interactive shell is: Ctrl-C must
    # stop it all the same (it once hung here under a CI runner that starts jobs that way).
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        assert process.stdout is not None
        printed = []
        for line in process.stdout:
            printed.append(line)
            if line.startswith("Ctrl-C"):
                break
        output = "".join(printed)
        endpoint = re.search(r"endpoint: (http://127\.0\.0\.1:\d+/v1)", output)
        assert endpoint is not None, output
        assert f"{JOB_ARN_HEADER}: {JOB}" in output and TRAJECTORY_ID_HEADER in output

        headers = {JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: "episode-1"}
        with openai.OpenAI(base_url=endpoint.group(1), api_key="k", default_headers=headers) as client:
            reply = client.chat.completions.create(
                model="default", messages=[{"role": "user", "content": "hi"}]
            )
        assert 1 <= reply.usage.completion_tokens <= 8
        assert reply.choices[0].model_extra["token_ids"]
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0


def test_serve_refuses_a_directory_without_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--model", str(tmp_path), "--port", "0"]) == 2
    assert "not a model directory" in capsys.readouterr().out


def test_serve_refuses_an_admin_key_agents_would_hold(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", str(tiny_model_dir), "--port", "0", "--api-key", "k", "--admin-key", "k"]
    assert main(argv) == 2
    assert "--admin-key must differ from --api-key" in capsys.readouterr().out


def test_serve_refuses_gateway_workers_without_vllm(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The hf engine lives in the serving process: worker processes could not share it.
    assert main(["--model", str(tiny_model_dir), "--port", "0", "--gateway-workers", "2"]) == 2
    assert "more than 1 needs --engine vllm" in capsys.readouterr().out


def test_serve_puts_the_hf_engine_on_the_device_and_dtype_asked(tiny_model_dir: Path) -> None:
    import torch

    from policy_server.cli import _engine, _parser

    told = _engine(
        _parser().parse_args(["--model", str(tiny_model_dir), "--device", "cpu", "--dtype", "bfloat16"])
    )
    assert (told.device, told.dtype) == (torch.device("cpu"), torch.bfloat16)  # type: ignore[attr-defined]
    auto = _engine(_parser().parse_args(["--model", str(tiny_model_dir)]))
    expected = (
        (torch.device("cuda:0"), torch.bfloat16)
        if torch.cuda.is_available()
        else (torch.device("cpu"), torch.float32)
    )
    assert (auto.device, auto.dtype) == expected  # type: ignore[attr-defined]


def test_serve_says_it_takes_any_caller_once_and_prints_no_library_noise(
    tiny_model_dir: Path, tmp_path: Path, random_adapter: Callable[..., Path]
) -> None:
    """Without --api-key the gateway on loopback takes any local caller: it says so, once. Loading the
    model and the adapter prints neither transformers' progress bars nor peft's FutureWarning, and
    rftkit's own lines stay."""
    adapter = random_adapter(tmp_path / "adapter", seed=5)
    command = [sys.executable, "-u", "-m", "handlers.cli", "serve", "--model", str(tiny_model_dir)]
    command += ["--engine", "hf", "--port", "0", "--adapter", str(adapter)]
    # The environment a user's shell gives it, not what earlier in-process commands set here.
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "PYTHONWARNINGS")}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        assert process.stdout is not None
        printed = []
        for line in process.stdout:
            printed.append(line)
            if line.startswith("Ctrl-C"):
                break
        output = "".join(printed)
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    said = "no API key: any process on this machine may call the model (--api-key KEY makes callers send one)"
    assert output.count(said) == 1, output
    assert f"adapter {adapter} loaded as version 1" in output and "endpoint: http://127.0.0.1:" in output
    assert "is_gradient_checkpointing" not in output and "FutureWarning" not in output, output
    assert "Loading weights" not in output and "it/s]" not in output, output
