"""The hf engine on the tiny model: recorded logprobs equal a teacher-forced transformers + peft pass,
concurrent requests share forward passes, seeded sampling, adapter hot-swap, stop conditions."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from policy_server.engines import HFEngine, sample_tokens
from policy_server.engines.base import GenerationRequest, GenerationResult

T = TypeVar("T")


def run_engine(model_dir: Path, body: Callable[[HFEngine], Awaitable[T]], **kwargs: Any) -> T:
    async def main() -> T:
        engine = HFEngine(model_dir, **kwargs)
        await engine.start()
        try:
            return await body(engine)
        finally:
            await engine.close()

    return asyncio.run(main())


@pytest.fixture(scope="module")
def adapters(
    random_adapter: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return random_adapter(root / "a", seed=1, rank=4), random_adapter(root / "b", seed=2, rank=4)


def request(text: str, **kwargs: Any) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": text}], **{"max_tokens": 12, **kwargs})


def teacher_forced_logprobs(model: Any, result: GenerationResult) -> torch.Tensor:
    ids = torch.tensor([result.prompt_token_ids + result.completion_token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(result.prompt_token_ids) - 1 : -1]
    completion = torch.tensor(result.completion_token_ids)
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, completion[:, None]).squeeze(-1)


PROMPTS = [
    "hi",
    "What is the weather in Paris today? Please answer briefly.",
    "Move up.",
    "Guess the word in six tries. Each guess must be a valid five-letter word, and green means right.",
    "ok",
    "Walk the maze: ##.#\n#S.#\n#.G#",
]
TOOLS = [
    {"type": "function", "function": {"name": "move", "parameters": {"type": "object", "properties": {}}}}
]


@pytest.mark.parametrize("with_adapter", [False, True], ids=["base", "adapter"])
def test_logprobs_match_a_teacher_forced_pass(
    tiny_model_dir: Path, adapters: tuple[Path, Path], with_adapter: bool
) -> None:
    version = 1 if with_adapter else 0

    async def body(engine: HFEngine) -> tuple[list[GenerationResult], int]:
        if with_adapter:
            await engine.load_adapter(1, str(adapters[0]))
        first = [
            request(text, max_tokens=24, adapter_version=version, top_p=0.9 if i % 2 else 1.0, seed=i)
            for i, text in enumerate(PROMPTS[:3])
        ]
        running = [asyncio.create_task(engine.generate(r)) for r in first]
        # Join the others mid-generation, so their cache is merged into a running batch.
        while engine.stats.decode_passes < 3 and not all(task.done() for task in running):
            await asyncio.sleep(0.001)
        later = [
            request(
                text, max_tokens=10 + 3 * i, adapter_version=version, tools=TOOLS, temperature=0.7, seed=9 + i
            )
            for i, text in enumerate(PROMPTS[3:])
        ]
        results = await asyncio.gather(*running, *(engine.generate(r) for r in later))
        return list(results), engine.stats.peak_batch_rows

    results, peak_rows = run_engine(tiny_model_dir, body)
    assert peak_rows > 3, "the later requests never shared a forward pass with the running ones"
    assert len({len(r.prompt_token_ids) for r in results}) == len(PROMPTS)

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    if with_adapter:
        model = PeftModel.from_pretrained(model, adapters[0])
    model.eval()
    for index, (text, result) in enumerate(zip(PROMPTS, results, strict=True)):
        expected_prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}],
            tools=TOOLS if index >= 3 else None,
            add_generation_prompt=True,
            return_dict=False,
        )
        assert result.prompt_token_ids == expected_prompt
        assert result.logprobs_mode == "raw"
        assert len(result.completion_logprobs) == len(result.completion_token_ids) >= 1
        reference = teacher_forced_logprobs(model, result)
        diff = (torch.tensor(result.completion_logprobs) - reference).abs().max().item()
        assert diff <= 1e-3, f"request {index}: max |logprob diff| {diff}"


def test_concurrent_requests_share_forward_passes(tiny_model_dir: Path) -> None:
    async def body(engine: HFEngine) -> list[GenerationResult]:
        requests = [request(f"request number {i} " + "x " * i, max_tokens=16, seed=i) for i in range(16)]
        return list(await asyncio.gather(*(engine.generate(r) for r in requests)))

    engine_stats: dict[str, int] = {}

    async def counted(engine: HFEngine) -> list[GenerationResult]:
        results = await body(engine)
        engine_stats.update(vars(engine.stats))
        return results

    results = run_engine(tiny_model_dir, counted)
    tokens = sum(len(r.completion_token_ids) for r in results)
    assert engine_stats["completion_tokens"] == tokens
    assert engine_stats["requests"] == 16
    # One request at a time would need one forward pass per token.
    assert engine_stats["forward_passes"] * 4 < tokens
    assert engine_stats["peak_batch_rows"] >= 8


def test_seeded_sampling_is_reproducible_in_any_batch(tiny_model_dir: Path) -> None:
    async def body(engine: HFEngine) -> tuple[list[int], list[list[int]], list[int]]:
        seeded = request("Move up.", max_tokens=16, seed=123)
        alone = await engine.generate(seeded)
        crowd = await asyncio.gather(
            *(engine.generate(request(f"noise {i}", max_tokens=16)) for i in range(5)),
            engine.generate(seeded),
        )
        other = await engine.generate(request("Move up.", max_tokens=16, seed=124))
        return alone.completion_token_ids, [r.completion_token_ids for r in crowd], other.completion_token_ids

    alone, crowd, other = run_engine(tiny_model_dir, body)
    assert crowd[-1] == alone
    assert other != alone
    assert len({tuple(ids) for ids in crowd[:-1]}) == 5, "unseeded requests got the same samples"


def test_adapter_hot_swap_without_reloading(tiny_model_dir: Path, adapters: tuple[Path, Path]) -> None:
    greedy = {"temperature": 0.0, "max_tokens": 10}

    async def body(engine: HFEngine) -> dict[str, Any]:
        async def ids(version: int) -> list[int]:
            return (
                await engine.generate(request("Move up.", adapter_version=version, **greedy))
            ).completion_token_ids

        seen: dict[str, Any] = {"base": await ids(0)}
        await engine.load_adapter(1, str(adapters[0]))
        seen["v1"], seen["base_after_v1"] = await ids(1), await ids(0)
        await engine.load_adapter(2, str(adapters[1]))
        seen["v2"] = await ids(2)
        with pytest.raises(ValueError, match="already loaded"):
            await engine.load_adapter(2, str(adapters[1]))
        await engine.unload_adapter(1)
        with pytest.raises(ValueError, match="adapter version 1 is not loaded"):
            await ids(1)
        seen["v2_after_unload"] = await ids(2)
        await engine.unload_adapter(2)
        seen["base_after_all"] = await ids(0)
        await engine.load_adapter(3, str(adapters[0]))
        seen["v3"] = await ids(3)
        return seen

    seen = run_engine(tiny_model_dir, body)
    assert seen["v1"] != seen["base"]
    assert seen["v2"] not in (seen["base"], seen["v1"])
    assert seen["base_after_v1"] == seen["base"] == seen["base_after_all"]
    assert seen["v2_after_unload"] == seen["v2"]
    assert seen["v3"] == seen["v1"]


def test_max_tokens_and_stop_strings_finish_rows(tiny_model_dir: Path) -> None:
    async def body(engine: HFEngine) -> tuple[GenerationResult, GenerationResult, str]:
        full = await engine.generate(request("Move up.", max_tokens=6, seed=7))
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
        pieces = [tokenizer.decode([token]) for token in full.completion_token_ids]
        stop = next(piece for piece in pieces[2:] if piece.strip())
        stopped = await engine.generate(request("Move up.", max_tokens=6, seed=7, stop=[stop]))
        return full, stopped, stop

    full, stopped, stop = run_engine(tiny_model_dir, body)
    assert full.finish_reason == "length" and len(full.completion_token_ids) == 6
    assert stopped.finish_reason == "stop"
    assert stopped.completion_token_ids == full.completion_token_ids[: len(stopped.completion_token_ids)]
    assert len(stopped.completion_token_ids) < 6
    assert stop not in (stopped.content or "")
    assert (full.content or "").startswith(stopped.content or "")


def test_eos_ends_the_completion_and_is_recorded(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A model rigged so that <|im_end|> or <|endoftext|> wins greedily at every step."""
    rigged = tmp_path / "rigged"
    shutil.copytree(tiny_model_dir, rigged)
    weights = load_file(rigged / "model.safetensors")
    tokenizer = AutoTokenizer.from_pretrained(rigged)
    im_end, end_of_text = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    head = torch.zeros_like(weights["lm_head.weight"])
    head[im_end, 0], head[end_of_text, 0] = 100.0, -100.0
    weights["lm_head.weight"] = head
    save_file(weights, rigged / "model.safetensors", metadata={"format": "pt"})

    async def body(engine: HFEngine) -> GenerationResult:
        return await engine.generate(request("hi", temperature=0.0, max_tokens=5, tools=TOOLS))

    result = run_engine(rigged, body)
    assert result.completion_token_ids in ([im_end], [end_of_text])
    assert result.finish_reason == "stop" and result.content is None and result.tool_calls == []
    assert len(result.completion_logprobs) == 1


def test_bad_requests_raise_and_the_engine_keeps_serving(tiny_model_dir: Path) -> None:
    async def body(engine: HFEngine) -> GenerationResult:
        for bad, message in [
            (request("hi", adapter_version=4), "adapter version 4 is not loaded"),
            (request("hi", max_tokens=0), "max_tokens must be at least 1"),
            (request("hi", top_p=0.0), "top_p"),
            (request("word " * 3000), "context"),
            (GenerationRequest(messages=[], max_tokens=3), "messages must not be empty"),
        ]:
            with pytest.raises(ValueError, match=message):
                await engine.generate(bad)
        with pytest.raises(ValueError, match="not a peft adapter directory"):
            await engine.load_adapter(1, str(tiny_model_dir))
        return await engine.generate(request("hi", max_tokens=3))

    assert len(run_engine(tiny_model_dir, body).completion_token_ids) >= 1


def test_close_fails_requests_still_running(tiny_model_dir: Path) -> None:
    async def main() -> BaseException | GenerationResult:
        engine = HFEngine(tiny_model_dir)
        await engine.start()
        running = asyncio.create_task(engine.generate(request("hi", max_tokens=1500, seed=5)))
        while engine.stats.decode_passes < 2 and not running.done():
            await asyncio.sleep(0.001)
        await engine.close()
        return (await asyncio.gather(running, return_exceptions=True))[0]

    outcome = asyncio.run(main())
    assert isinstance(outcome, RuntimeError) and "closed" in str(outcome)


def test_sampling_follows_temperature_and_top_p() -> None:
    probabilities = torch.tensor([0.5, 0.3, 0.15, 0.05])
    rows = 4000
    logits = probabilities.log().repeat(rows, 1)
    generators = [torch.Generator().manual_seed(i) for i in range(rows)]

    def frequencies(temperature: float, top_p: float) -> torch.Tensor:
        tokens, logprobs = sample_tokens(
            logits, torch.full((rows,), temperature), torch.full((rows,), top_p), generators
        )
        assert torch.allclose(logprobs, probabilities.log()[tokens], atol=1e-6), "logprobs must be raw"
        return torch.bincount(tokens, minlength=4) / rows

    assert torch.allclose(frequencies(1.0, 1.0), probabilities, atol=0.03)
    assert torch.allclose(frequencies(1.0, 0.7), torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=0.03)
    sharpened = probabilities**2 / (probabilities**2).sum()
    assert torch.allclose(frequencies(0.5, 1.0), sharpened, atol=0.03)
    assert torch.equal(frequencies(0.0, 0.5), torch.tensor([1.0, 0.0, 0.0, 0.0]))
