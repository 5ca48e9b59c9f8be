"""The hf engine switches its LoRA layers only when the served version changes, and each version
samples what an engine serving it alone samples: the base beside adapters, an adapter loaded while
the base is served (its new layers stay off for the base), adapters taking turns."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from policy_server.engines import HFEngine
from policy_server.engines.base import GenerationRequest

PROMPTS = ["Move up.", "Walk the maze: ##.#\n#S.#\n#.G#", "hi"]


def requests(version: int) -> list[GenerationRequest]:
    """One greedy and two seeded sampled calls, long enough for many decode steps."""
    return [
        GenerationRequest(
            messages=[{"role": "user", "content": text}],
            adapter_version=version,
            max_tokens=24,
            temperature=0.0 if index == 0 else 1.0,
            seed=index,
        )
        for index, text in enumerate(PROMPTS)
    ]


def mlp_adapter(model_dir: Path, out: Path) -> Path:
    """A LoRA adapter on modules the other adapters leave alone (loading it adds new LoRA layers)."""
    torch.manual_seed(3)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        LoraConfig(r=4, lora_alpha=8, target_modules=["gate_proj", "up_proj", "k_proj"]),
    )
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.3)
    model.save_pretrained(out)
    return out


def counted(name: str, method: Callable[[], None], calls: list[str]) -> Callable[[], None]:
    def call() -> None:
        calls.append(name)
        method()

    return call


async def generated(engine: HFEngine, version: int) -> list[list[int]]:
    results = await asyncio.gather(*(engine.generate(r) for r in requests(version)))
    return [result.completion_token_ids for result in results]


async def alone(model_dir: Path, version: int, adapter: Path | None) -> list[list[int]]:
    engine = HFEngine(model_dir, max_batch_size=8)
    await engine.start()
    try:
        if adapter is not None:
            await engine.load_adapter(version, str(adapter))
        return await generated(engine, version)
    finally:
        await engine.close()


def test_versions_take_turns_with_one_switch_each(
    tiny_model_dir: Path,
    random_adapter: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = random_adapter(tmp_path / "a", seed=1, rank=4)
    second = mlp_adapter(tiny_model_dir, tmp_path / "b")
    switches: list[str] = []

    async def main() -> tuple[dict[str, list[list[int]]], int]:
        engine = HFEngine(tiny_model_dir, max_batch_size=8)
        await engine.start()
        try:
            await engine.load_adapter(1, str(first))
            tuner = engine._model.base_model
            for name in ("disable_adapter_layers", "enable_adapter_layers"):
                monkeypatch.setattr(tuner, name, counted(name, getattr(tuner, name), switches))
            seen = {"base": await generated(engine, 0), "v1": await generated(engine, 1)}
            seen["base again"] = await generated(engine, 0)
            steps = engine.stats.decode_passes
            await engine.load_adapter(2, str(second))  # while the base is served: new layers appear
            seen["base after v2 loaded"] = await generated(engine, 0)
            seen["v2"] = await generated(engine, 2)
            seen["v1 again"] = await generated(engine, 1)
            return seen, steps
        finally:
            await engine.close()

    seen, steps = asyncio.run(main())
    base = asyncio.run(alone(tiny_model_dir, 0, None))
    assert seen["base"] == seen["base again"] == seen["base after v2 loaded"] == base
    assert seen["v1"] == seen["v1 again"] == asyncio.run(alone(tiny_model_dir, 1, first))
    assert seen["v2"] == asyncio.run(alone(tiny_model_dir, 2, second))
    assert seen["v1"] != base and seen["v2"] not in (base, seen["v1"])
    # The layers are switched once per turn, not around each of the many steps: off for the base,
    # on for v1, off for the base, off again once v2's load added layers, on for v2; v1 after v2 only
    # changes the active adapter.
    assert steps > 10 * len(switches)
    off, on = "disable_adapter_layers", "enable_adapter_layers"
    assert switches == [off, on, off, off, on]
