"""The qwen3_vl family (SkyRL's visual-maze model) at toy size: ``rft model tiny --family qwen3_vl``
builds a Qwen3-VL that transformers loads and runs with images (DeepStack included); its template
renders Qwen3-VL's format; the hf engine serves image episodes through the real gateway with the
learner's logprobs, and one GRPO step trains LoRA on the tower, its mergers and the language model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from policy_server import PolicyServer, ServerThread
from policy_server.engines.hf import HFEngine
from policy_server.http.images import ImageLimits, image_from_bytes
from policy_server.models.families import family, family_of
from policy_server.models.model_cli import main as model_main
from policy_server.models.vision_inputs import VisionInputs, is_vision_model, load_model, position_ids
from tests.vision_helpers import image_bytes, image_part, picture_episode
from trainer.algo.sequences import build_sequences
from trainer.config import LoraConfig, TrainConfig
from trainer.learner.learner import Learner
from trainer.learner.vision import lora_targets

JOB = "arn:aws:sagemaker:us-west-2:123456789012:training-job/qwen3-vl"
MOVE = {
    "type": "function",
    "function": {"name": "move", "parameters": {"type": "object", "properties": {"d": {"type": "string"}}}},
}
VISION = "<|vision_start|><|image_pad|><|vision_end|>"
# Qwen3-VL's format (its Instruct models' template): Qwen's tools preamble, parts with nothing between
# them, hermes calls after the text, consecutive tool results in one user turn.
RENDERED = (
    "<|im_start|>system\nWalk the maze.\n\n# Tools\n\nYou may call one or more functions to assist with "
    "the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
    '<tools>\n{"type": "function", "function": {"name": "move", "parameters": {"type": "object", '
    '"properties": {"d": {"type": "string"}}}}}\n</tools>\n\nFor each function call, return a json '
    "object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    f"<|im_start|>user\nWhere is the goal?{VISION}<|im_end|>\n"
    '<|im_start|>assistant\n<tool_call>\n{"name": "move", "arguments": {"d": "up"}}\n</tool_call><|im_end|>\n'
    f"<|im_start|>user\n<tool_response>\nmoved{VISION}\n</tool_response>\n<tool_response>\nwall\n"
    "</tool_response><|im_end|>\n"
    '<|im_start|>assistant\nLeft.\n<tool_call>\n{"name": "move", "arguments": {"d": "left"}}\n'
    "</tool_call><|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def qwen3_vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qwen3-vl") / "model"
    assert model_main(["tiny", str(out), "--family", "qwen3_vl"]) == 0
    return out


def _conversation() -> list[dict]:
    def call(direction: str) -> dict:
        return {"type": "function", "function": {"name": "move", "arguments": {"d": direction}}}

    return [
        {"role": "system", "content": "Walk the maze."},
        {"role": "user", "content": [{"type": "text", "text": "Where is the goal?"}, image_part()]},
        {"role": "assistant", "content": None, "tool_calls": [call("up")]},
        {"role": "tool", "content": [{"type": "text", "text": "moved"}, image_part()]},
        {"role": "tool", "content": "wall"},
        {"role": "assistant", "content": "Left.", "tool_calls": [call("left")]},
    ]


def test_the_tiny_model_is_a_qwen3_vl_its_family_serves_with_hermes(qwen3_vl_dir: Path) -> None:
    qwen3_vl = family("qwen3_vl")
    assert family_of(qwen3_vl_dir) is qwen3_vl and qwen3_vl.vision
    assert (qwen3_vl.vllm_tool_call_parser, qwen3_vl.vllm_reasoning_parser) == ("hermes", None)
    tokenizer = AutoTokenizer.from_pretrained(qwen3_vl_dir)
    assert (
        tokenizer.apply_chat_template(_conversation(), tools=[MOVE], tokenize=False)
        + ("<|im_start|>assistant\n")
        == RENDERED
    )
    for token in (*VISION.replace("><", ">\n<").split("\n"), "<think>", "</think>"):
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    # The family's parser (vLLM's hermes) reads a rendered call back to the call.
    rendered_call = RENDERED.rsplit("<|im_start|>assistant\n", 2)[1].removesuffix("<|im_end|>\n")
    parsed = qwen3_vl.parse_text(rendered_call, tools=True)
    assert parsed.content == "Left."
    assert [call["function"]["name"] for call in parsed.tool_calls] == ["move"]
    assert parsed.tool_calls[0]["function"]["arguments"] == '{"d": "left"}'


def test_images_reach_the_language_model_through_the_merger_and_deepstack(qwen3_vl_dir: Path) -> None:
    model = load_model(qwen3_vl_dir, dtype=torch.float32).eval()
    assert is_vision_model(model.config) and type(model).__name__ == "Qwen3VLForConditionalGeneration"
    assert model.config.vision_config.deepstack_visual_indexes == [0]
    vision = VisionInputs(qwen3_vl_dir, model.config)
    pixels = vision.pixels([image_from_bytes(image_bytes(), ImageLimits())])
    assert pixels["image_grid_thw"].tolist() == [[1, 8, 8]] and vision.tokens_per_image(
        pixels["image_grid_thw"]
    ) == [16]
    tokenizer = AutoTokenizer.from_pretrained(qwen3_vl_dir)
    prompt = tokenizer.apply_chat_template(
        _conversation()[1:2], add_generation_prompt=True, return_dict=False
    )
    ids = torch.tensor([vision.expand(prompt, pixels["image_grid_thw"])])
    mask = torch.ones_like(ids)
    positions = position_ids(model, ids, mask, pixels["image_grid_thw"])
    # Text after the 4x4 merged image continues from its largest position + 1, not its length.
    assert positions.shape == (3, 1, ids.shape[1]) and int(positions.max()) == ids.shape[1] - 16 + 4 - 1

    def last_logits(**inputs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask, position_ids=positions, **inputs).logits[0, -1]

    logits = last_logits(**pixels)
    other = vision.pixels([image_from_bytes(image_bytes((0, 200, 0)), ImageLimits())])
    assert torch.isfinite(logits).all() and not torch.allclose(logits, last_logits(**other))
    with torch.no_grad():
        model.model.visual.deepstack_merger_list[0].linear_fc2.weight.mul_(2.0)
    assert not torch.allclose(logits, last_logits(**pixels))  # DeepStack's features reach the LM too


def test_lora_scopes_name_qwen3_vls_tower_mergers_and_language_model(qwen3_vl_dir: Path) -> None:
    model = load_model(qwen3_vl_dir)
    language = set(lora_targets(model, LoraConfig()))
    assert language and all(name.startswith("model.language_model.") for name in language)
    projectors = set(lora_targets(model, LoraConfig(adapt_vision="projector"))) - language
    assert {name.rsplit(".", 1)[0] for name in projectors} == {
        "model.visual.merger",
        "model.visual.deepstack_merger_list.0",
    }
    tower = set(lora_targets(model, LoraConfig(adapt_vision="all"))) - language
    assert projectors < tower and any(".blocks.1.attn.qkv" in name for name in tower)


@pytest.fixture(scope="module")
def served(qwen3_vl_dir: Path) -> Iterator[tuple[PolicyServer, ServerThread]]:
    server = PolicyServer(HFEngine(qwen3_vl_dir))
    thread = ServerThread(server).start()
    server.open_job(JOB, max_tokens=5, auto_open_rollouts=True)
    try:
        yield server, thread
    finally:
        thread.stop()


def _matches_sampler(learner: Learner, sequences: list) -> None:
    for sequence, logprobs in zip(sequences, learner.old_logprobs(sequences), strict=True):
        mask = torch.tensor(sequence.loss_mask, dtype=torch.bool)
        torch.testing.assert_close(
            logprobs[mask], torch.tensor(sequence.behavior_logprobs)[mask], atol=1e-3, rtol=0
        )


def test_hf_engine_image_episodes_match_the_learner_and_train_tower_and_language_model(
    served: tuple[PolicyServer, ServerThread], qwen3_vl_dir: Path, tmp_path: Path
) -> None:
    server, thread = served
    red, blue, green = (200, 0, 0), (0, 0, 200), (0, 160, 0)
    picture_episode(thread, JOB, "a", [red, blue, blue])
    picture_episode(thread, JOB, "b", [green, red])
    traces = [server.take_trace(JOB, rollout) for rollout in ("a", "b")]
    assert [ref.length for ref in traces[0].calls[0].images] == [16]  # 64x64 -> 8x8 patches -> 4x4
    sequences = [sequence for trace in traces for sequence in build_sequences(trace)]
    assert [sequence.num_calls for sequence in sequences] == [3, 2]  # each turn extends the last
    config = TrainConfig.model_validate(
        {"learning_rate": 5e-2, "max_steps": 4, "loss_type": "grpo", "lora": {"adapt_vision": "all"}}
    )
    learner = Learner(qwen3_vl_dir, config, image_store=server.image_store)
    _matches_sampler(learner, sequences)

    sequences[0].advantage, sequences[1].advantage = 1.0, -1.0
    before = {name: p.detach().clone() for name, p in learner.model.named_parameters()}
    assert not learner.train_step(sequences, seed=0).skipped
    changed = {name for name, p in learner.model.named_parameters() if not torch.equal(p, before[name])}
    assert all("lora_" in name for name in changed)
    for part in (".language_model.", ".visual.blocks.", ".visual.merger.", ".visual.deepstack_merger_list."):
        assert any(part in name for name in changed), part

    version = thread.run(server.load_adapter(learner.save_adapter(tmp_path / "adapter")))
    picture_episode(thread, JOB, "c", [red, blue])
    trace = server.take_trace(JOB, "c")
    assert {call.adapter_version for call in trace.calls} == {version}
    _matches_sampler(learner, build_sequences(trace))
    for done in [*traces, trace]:
        server.release_trace(done)
    assert len(server.image_store) == 0


def test_the_mazes_picture_demonstrations_warm_start_tower_mergers_and_language_model(
    qwen3_vl_dir: Path, tmp_path: Path
) -> None:
    """``rft sft`` on pictures (trainer/sft/vision.py): the model computes its own M-RoPE positions
    from the placeholders, and LoRA reaches Qwen3-VL's tower, merger, DeepStack merger and language
    model by their module names."""
    from peft import PeftModel

    from agents.maze.demonstrations import maze_demonstrations
    from trainer.sft.text import run_sft

    targets = ["embed_tokens", "q_proj", "v_proj", "lm_head", "qkv", "linear_fc1", "linear_fc2"]
    result = run_sft(
        qwen3_vl_dir,
        maze_demonstrations(4, observation="image"),
        tmp_path / "adapter",
        steps=6,
        batch_size=2,
        learning_rate=5e-3,
        target_modules=targets,
        seed=0,
    )
    assert sum(result.losses[-3:]) / 3 < 0.75 * result.losses[0], result.losses
    model = PeftModel.from_pretrained(load_model(qwen3_vl_dir, dtype=torch.float32), result.adapter_dir)
    trained = {name for name, p in model.named_parameters() if "lora_B" in name and torch.count_nonzero(p)}
    for part in (".language_model.", ".visual.blocks.", ".visual.merger.", ".visual.deepstack_merger_list."):
        assert any(part in name for name in trained), part


def test_image_and_text_calls_share_batches_and_sample_as_they_would_alone(qwen3_vl_dir: Path) -> None:
    """Batch invariance holds with DeepStack: a row's features land on its own image tokens only."""
    import asyncio
    from typing import Any

    from policy_server.engines.base import GenerationRequest
    from policy_server.http.images import request_images

    def request(content: Any, seed: int) -> GenerationRequest:
        messages = [{"role": "user", "content": content}]
        return GenerationRequest(
            messages, max_tokens=4, seed=seed, images=request_images(messages, ImageLimits())
        )

    async def run() -> tuple[list[Any], list[Any], int]:
        engine = HFEngine(qwen3_vl_dir, max_batch_size=8)
        await engine.start()
        try:
            made = [
                request([image_part(image_bytes((200, 20, 20)))], 1),
                request("plain text", 2),
                request([image_part(image_bytes((20, 20, 200), size=96))], 3),
            ]
            together = await asyncio.gather(*(engine.generate(r) for r in made))
            peak = engine.stats.peak_batch_rows
            alone = [await engine.generate(r) for r in made]
        finally:
            await engine.close()
        return together, alone, peak

    together, alone, peak = asyncio.run(run())
    assert peak >= 2
    for shared, single in zip(together, alone, strict=True):
        assert shared.prompt_token_ids == single.prompt_token_ids
        assert shared.completion_token_ids == single.completion_token_ids
        assert shared.completion_logprobs == single.completion_logprobs  # to the bit
