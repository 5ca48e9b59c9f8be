"""The hf engine is batch-invariant: a seeded request samples the same tokens with the same logprobs,
to the last bit, alone or in batches of any size, padding and arrival time; and the row-wise
attention that makes it so computes what transformers' own attention computes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from policy_server.engines import batch_invariant
from policy_server.engines.base import GenerationRequest, GenerationResult
from policy_server.engines.hf import HFEngine

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "move",
            "parameters": {"type": "object", "properties": {"direction": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def demo_like_adapter(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random LoRA on the embeddings, every projection and lm_head, as the demo trains."""
    torch.manual_seed(3)
    modules = ["embed_tokens", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj"]
    config = LoraConfig(r=8, target_modules=[*modules, "down_proj", "lm_head"], init_lora_weights=False)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), config)
    out = tmp_path_factory.mktemp("adapter") / "lora"
    model.save_pretrained(out)
    return out


def maze_request(index: int, seed: int) -> GenerationRequest:
    text = f"Maze {index}: " + "#S..#.G# " * (1 + index % 7)  # prompts of different lengths
    return GenerationRequest(
        messages=[{"role": "system", "content": "Walk the maze."}, {"role": "user", "content": text}],
        tools=TOOLS,
        max_tokens=12,
        temperature=1.0,
        seed=seed,
        adapter_version=1,
    )


def test_a_row_is_the_same_alone_and_in_any_batch(tiny_model_dir: Path, demo_like_adapter: Path) -> None:
    async def main() -> tuple[GenerationResult, list[GenerationResult]]:
        engine = HFEngine(tiny_model_dir)
        await engine.start()
        await engine.load_adapter(1, str(demo_like_adapter))
        try:
            alone = await engine.generate(maze_request(3, 42))
            together = []
            for others in (2, 19):  # below and above the padded matrix-product rows
                batch = [maze_request(i, 100 + i) for i in range(others)] + [maze_request(3, 42)]
                together.append((await asyncio.gather(*map(engine.generate, batch)))[-1])

            async def late(request: GenerationRequest, delay: float) -> GenerationResult:
                await asyncio.sleep(delay)
                return await engine.generate(request)

            # Joining a batch mid-generation: its cache is merged with left padding.
            staggered = [late(maze_request(i, 200 + i), 0.0) for i in range(4)]
            together.append((await asyncio.gather(*staggered, late(maze_request(3, 42), 0.05)))[-1])
            return alone, together
        finally:
            await engine.close()

    alone, together = asyncio.run(main())
    assert len(alone.completion_token_ids) > 3
    for result in together:
        assert result.completion_token_ids == alone.completion_token_ids
        assert result.completion_logprobs == alone.completion_logprobs  # bitwise, not approximately


def test_a_prefill_of_many_prompts_gives_each_its_logits_alone(
    tiny_model_dir: Path, demo_like_adapter: Path
) -> None:
    """17 prompts prefilled at once (more rows than are padded): each row's next-token logits, taken
    from its last position as the engine takes them, equal that prompt's logits alone, bit for bit."""
    from peft import PeftModel

    attention = batch_invariant.register()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=attention)
    model = PeftModel.from_pretrained(base, demo_like_adapter).eval()
    batch_invariant.pad_rows(model, batch_invariant.min_gemm_rows())
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, 200, (20 + 7 * i,), generator=generator) for i in range(17)]

    def last_logits(rows: list[torch.Tensor]) -> torch.Tensor:
        width = max(len(row) for row in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for index, row in enumerate(rows):  # left padding, as the engine batches
            ids[index, width - len(row) :] = row
            mask[index, width - len(row) :] = 1
        lengths = [len(row) for row in rows]
        with torch.inference_mode(), batch_invariant.row_lengths(lengths, lengths):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1)
        return out.logits[:, -1]

    together = last_logits(prompts)
    for index, prompt in enumerate(prompts):
        assert torch.equal(together[index], last_logits([prompt])[0]), f"prompt {index}"


def test_rowwise_attention_computes_what_sdpa_computes(tiny_model_dir: Path) -> None:
    name = batch_invariant.register()
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa").eval()
    rowwise = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=name).eval()
    lengths = [5, 9, 2]
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    generator = torch.Generator().manual_seed(0)
    for row, length in enumerate(lengths):  # left padding, as the engine batches
        ids[row, width - length :] = torch.randint(10, 200, (length,), generator=generator)
        mask[row, width - length :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        expected = reference(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        batch_invariant.pad_rows(rowwise, batch_invariant.min_gemm_rows())
        with batch_invariant.row_lengths(lengths, lengths):
            got = rowwise(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    for row, length in enumerate(lengths):
        real = slice(width - length, width)
        torch.testing.assert_close(got[row, real], expected[row, real], rtol=1e-5, atol=1e-5)


def test_rowwise_attention_needs_the_row_lengths(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, attn_implementation=batch_invariant.register()
    )
    with pytest.raises(RuntimeError, match="row_lengths"):
        model(input_ids=torch.tensor([[11, 12, 13]]))
