"""The hf engine on a real CUDA device (marked ``gpu``: deselected without one;
``bench/device_check.sh`` runs them on the GPU machine).

In bfloat16 it samples, hot-loads an adapter and records logprobs a teacher-forced pass of the same
weights agrees with (to bf16's precision); batch invariance is off by default there; turned on, the
row-wise path runs on CUDA and a row's logprobs alone and in a batch agree closely (exactly is not
claimed: cuBLAS picks kernels by shape).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from policy_server.engines.base import GenerationRequest, GenerationResult
from policy_server.engines.hf import HFEngine

pytestmark = pytest.mark.gpu

PROMPTS = ["Walk the maze: ##.#\n#S.#\n#.G#", "ok", "Guess the word in six tries.", "Hello there, " * 9]


def record(name: str, figures: dict[str, Any]) -> None:
    """Append a test's figures to $RFTKIT_GPU_FIGURES (JSON lines) when set."""
    path = os.environ.get("RFTKIT_GPU_FIGURES")
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps({"test": name, **figures}) + "\n")


@pytest.fixture(scope="module")
def adapter(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(5)
    config = LoraConfig(r=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), config)
    out = tmp_path_factory.mktemp("cuda-adapter") / "lora"
    model.save_pretrained(out)
    return out


def request(text: str, seed: int, version: int = 0, max_tokens: int = 16) -> GenerationRequest:
    return GenerationRequest(
        messages=[{"role": "user", "content": text}],
        max_tokens=max_tokens,
        temperature=1.0,
        seed=seed,
        adapter_version=version,
    )


def _teacher_forced(model: Any, result: GenerationResult) -> torch.Tensor:
    ids = torch.tensor([result.prompt_token_ids + result.completion_token_ids], device="cuda:0")
    with torch.no_grad():
        logits = model(ids).logits.float()
    start = len(result.prompt_token_ids)
    logprobs = torch.log_softmax(logits[0, start - 1 : -1], dim=-1)
    targets = torch.tensor(result.completion_token_ids, device="cuda:0")[:, None]
    return logprobs.gather(-1, targets)[:, 0].cpu()


def test_the_engine_samples_and_loads_adapters_on_cuda_in_bf16(tiny_model_dir: Path, adapter: Path) -> None:
    async def main() -> tuple[list[GenerationResult], bool]:
        engine = HFEngine(tiny_model_dir, device="cuda:0", dtype=torch.bfloat16, max_batch_size=8)
        await engine.start()
        try:
            await engine.load_adapter(1, str(adapter))
            calls = [request(text, seed, version=seed % 2) for seed, text in enumerate(PROMPTS)]
            return list(await asyncio.gather(*map(engine.generate, calls))), engine.batch_invariant
        finally:
            await engine.close()

    results, invariant = asyncio.run(main())
    assert invariant is False  # the default on CUDA
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).to("cuda:0").eval()
    worst = 0.0
    for index, result in enumerate(results):
        assert len(result.completion_token_ids) == len(result.completion_logprobs) >= 1
        model = base
        if index % 2:
            model = PeftModel.from_pretrained(
                AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16), adapter
            )
            model = model.to("cuda:0").eval()
        reference = _teacher_forced(model, result)
        worst = max(worst, (torch.tensor(result.completion_logprobs) - reference).abs().max().item())
    record("hf_engine_bf16", {"max_abs_logprob_diff_vs_teacher_forced": worst})
    assert worst < 0.25, worst  # bf16: batched decode and one full pass round differently


def test_batch_invariant_mode_runs_on_cuda(tiny_model_dir: Path, adapter: Path) -> None:
    async def main() -> tuple[GenerationResult, list[GenerationResult]]:
        engine = HFEngine(tiny_model_dir, device="cuda:0", dtype=torch.float32, batch_invariant=True)
        await engine.start()
        try:
            await engine.load_adapter(1, str(adapter))
            alone = await engine.generate(request(PROMPTS[0], 42, version=1))
            together = []
            for others in (3, 19):
                batch = [request(PROMPTS[i % 4], 100 + i, version=1) for i in range(others)]
                batch.append(request(PROMPTS[0], 42, version=1))
                together.append((await asyncio.gather(*map(engine.generate, batch)))[-1])
            return alone, together
        finally:
            await engine.close()

    alone, together = asyncio.run(main())
    exact = all(result.completion_token_ids == alone.completion_token_ids for result in together)
    diffs = []
    for result in together:
        shared = 0
        while (
            shared < min(len(result.completion_token_ids), len(alone.completion_token_ids))
            and result.completion_token_ids[shared] == alone.completion_token_ids[shared]
        ):
            shared += 1
        assert shared >= 1, "the first sampled token differs between batch sizes"
        first = torch.tensor(result.completion_logprobs[:shared]) - torch.tensor(
            alone.completion_logprobs[:shared]
        )
        diffs.append(first.abs().max().item())
    record("batch_invariance_cuda_fp32", {"same_tokens": exact, "max_abs_logprob_diff": max(diffs)})
    assert max(diffs) < 1e-3, diffs
