"""Attaching to a vLLM server someone else started the plain way (`vllm serve MODEL`: no served name, no
LoRA), returning processed logprobs (`--logprobs-mode processed_logprobs`): `rft serve --vllm-url`
refuses at start with a sentence that names each flag to add.

One real vLLM start (about 20 s on two cores; eager, as rftkit runs vLLM's CPU build). Attaching to a
server with LoRA and raw logprobs (the served-name adoption, the logprobs check passing) is tested
against the module server of ``test_vllm_engine.py``, and `rft serve --vllm-url` attaching to the vLLM
another `rft serve` started against the module server of ``test_smollm2.py`` (one vLLM start fewer in
the suite).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from policy_server.engines.vllm_server import DYNAMO_DISABLE_ENV, UNIPROC_ENV, free_port

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def plain_vllm(
    tiny_model_dir: Path, vllm_python: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    port = free_port()
    # Run as rftkit runs the CPU build, its worker in the engine core's process and nothing compiled
    # (docs/benchmarks.md; plain, vLLM compiles the model for 20 s here and writes it under ~/.cache):
    # how vLLM hosts its worker and runs its model changes nothing that attaching checks.
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", UNIPROC_ENV: "0", DYNAMO_DISABLE_ENV: "1"}
    env.pop("VLLM_ALLOW_RUNTIME_LORA_UPDATING", None)
    log = (tmp_path_factory.mktemp("vllm") / "vllm.log").open("wb")
    command = [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model_dir)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--dtype", "float32"]
    command += ["--logprobs-mode", "processed_logprobs", "--enforce-eager"]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert process.poll() is None, f"vLLM exited with {process.returncode}; see {log.name}"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        else:
            pytest.fail(f"vLLM did not become healthy within 300 s; see {log.name}")
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)
        log.close()


def test_rft_serve_refuses_a_vllm_without_lora_or_raw_logprobs_and_says_how_to_start_it(
    plain_vllm: str, tiny_model_dir: Path
) -> None:
    # It serves the model under its path, not under 'policy'.
    (entry,) = httpx.get(f"{plain_vllm}/v1/models", timeout=10).json()["data"]
    assert entry["id"] == str(tiny_model_dir)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "handlers.cli",
            "serve",
            "--engine",
            "vllm",
            "--vllm-url",
            plain_vllm,
            "--model",
            str(tiny_model_dir),
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "was started without LoRA" in done.stdout
    assert "restart it with `--enable-lora --max-lora-rank" in done.stdout
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1" in done.stdout
    assert (
        "its logprobs are not the model's own (processed: the runner-up token that top-p left out came "
        "back with no logprob), and GRPO compares them with the learner's: restart it with "
        "`--logprobs-mode raw_logprobs` (vLLM's default)."
    ) in done.stdout, done.stdout
