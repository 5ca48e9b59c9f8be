"""Images end to end through the gateway on uvicorn, the hf engine and the tiny VLM: a real Strands
agent (image in a user message and in a tool result), the openai client (image in a tool message),
traces that record each image by hash and place, and bad images refused while the server serves on."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from strands import Agent
from strands.models.openai import OpenAIModel
from strands.types.exceptions import MaxTokensReachedException

from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER
from policy_server import PolicyServer, ServerThread
from policy_server.engines.hf import HFEngine
from policy_server.http.images import ImageLimits
from policy_server.trace import CallRecord
from tests.vision_helpers import data_url, image_bytes, image_part, strands_image_history

JOB = "arn:aws:sagemaker:us-west-2:123456789012:training-job/vision"
LIMITS = ImageLimits(max_image_bytes=16 * 1024, max_images_per_call=3, max_image_pixels=160 * 160)
RED, BLUE = image_bytes((200, 20, 20)), image_bytes((20, 20, 200), size=96)


@pytest.fixture(scope="module")
def served(tiny_vision_dir: Path) -> Iterator[tuple[PolicyServer, ServerThread]]:
    server = PolicyServer(HFEngine(tiny_vision_dir), image_limits=LIMITS)
    thread = ServerThread(server).start()
    server.open_job(JOB, max_tokens=6, auto_open_rollouts=True)
    try:
        yield server, thread
    finally:
        thread.stop()


def _headers(rollout_id: str) -> dict[str, str]:
    return {JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: rollout_id}


def _check_images(call: CallRecord, expected: list[bytes], image_token_id: int) -> None:
    """Each image recorded by hash, in order, on a run of placeholder tokens of the prompt."""
    assert [ref.sha256 for ref in call.images] == [hashlib.sha256(data).hexdigest() for data in expected]
    for ref in call.images:
        span = call.prompt_token_ids[ref.start : ref.start + ref.length]
        assert span == [image_token_id] * ref.length
        assert call.prompt_token_ids[ref.start - 1] != image_token_id
        assert call.prompt_token_ids[ref.start + ref.length] != image_token_id
    assert sum(ref.length for ref in call.images) == call.prompt_token_ids.count(image_token_id)
    # The recorded messages name images by hash; the bytes are in the store, not in every call.
    assert "base64" not in str(call.messages)


def test_a_strands_agent_sends_images_in_a_user_message_and_a_tool_result(
    served: tuple[PolicyServer, ServerThread],
) -> None:
    server, thread = served
    model = OpenAIModel(
        client_args={
            "base_url": f"{thread.url}/v1",
            "api_key": "unused",
            "default_headers": _headers("strands"),
        },
        model_id="default",
        params={"max_tokens": 6, "temperature": 1.0, "seed": 7},
    )
    history = strands_image_history(RED, BLUE)
    agent = Agent(model=model, messages=history, callback_handler=None)
    # The tiny model rarely stops within 6 tokens: Strands then raises after keeping the reply.
    with contextlib.suppress(MaxTokensReachedException):
        agent("And now?")
    assert agent.messages[-1]["role"] == "assistant" and agent.messages[-1]["content"]
    trace = server.take_trace(JOB, "strands")
    assert len(trace.calls) == 1 and trace.calls[0].completion_token_ids
    engine = server.engine
    assert isinstance(engine, HFEngine) and engine.image_token_id is not None
    _check_images(trace.calls[0], [RED, BLUE], engine.image_token_id)
    # 64x64 -> 8x8 patches -> 16 tokens; 96x96 -> 12x12 patches -> 36 tokens.
    assert [ref.length for ref in trace.calls[0].images] == [16, 36]
    stored = {path.name for path in server.image_store.root.iterdir()}
    assert stored == {hashlib.sha256(d).hexdigest() for d in (RED, BLUE)}
    server.release_trace(trace)
    assert not list(server.image_store.root.iterdir())


def test_openai_client_images_in_tool_messages_and_multi_turn_prompts_extend(
    served: tuple[PolicyServer, ServerThread],
) -> None:
    server, thread = served
    client = openai.OpenAI(base_url=f"{thread.url}/v1", api_key="unused", default_headers=_headers("multi"))
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Find the goal."}, image_part(RED)]}
    ]
    reply = client.chat.completions.create(model="default", messages=messages, seed=1)
    messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
    messages.append({"role": "tool", "tool_call_id": "c1", "content": [image_part(BLUE), image_part(BLUE)]})
    client.chat.completions.create(model="default", messages=messages, seed=2)
    trace = server.take_trace(JOB, "multi")
    first, second = trace.calls
    _check_images(second, [RED, BLUE, BLUE], server.engine.image_token_id)  # type: ignore[attr-defined]
    # Images included, the next prompt extends the previous prompt + completion (what merging needs).
    prefix = first.prompt_token_ids + first.completion_token_ids
    assert second.prompt_token_ids[: len(prefix)] == prefix
    assert second.images[:1] == first.images
    assert len(server.image_store) == 2  # BLUE once, however often it was sent
    server.release_trace(trace)


def test_sampled_logprobs_are_the_models_own_for_the_image_prompt(
    served: tuple[PolicyServer, ServerThread], tiny_vision_dir: Path
) -> None:
    """A teacher-forced forward (pixels and M-RoPE positions rebuilt) gives the recorded logprobs."""
    from policy_server.models.vision_inputs import VisionInputs, load_model, position_ids

    server, thread = served
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": [image_part(RED), image_part(BLUE)]}],
    }
    response = httpx.post(f"{thread.url}/v1/chat/completions", json=body, headers=_headers("lp"), timeout=60)
    assert response.status_code == 200, response.text
    call = server.take_trace(JOB, "lp").calls[0]
    model = load_model(tiny_vision_dir, dtype=torch.float32).eval()
    vision = VisionInputs(tiny_vision_dir, model.config)
    pixels = vision.pixels([server.image_store.image(ref.sha256) for ref in call.images])
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
    start = len(call.prompt_token_ids) - 1
    torch.testing.assert_close(logprobs[start:], torch.tensor(call.completion_logprobs), atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("data:image/png;base64,%%%garbage%%%", "does not decode"),
        ("http://example.com/maze.png", "fetches nothing"),
        ("https://example.com/maze.png", "fetches nothing"),
        ("data:image/png;base64,", "empty (0 bytes)"),
        (data_url(image_bytes(size=200)), "pixels, over this server's limit"),
        (data_url(bytes(20 * 1024)), "bytes, over this server's limit"),
    ],
)
def test_bad_images_get_a_400_sentence_and_the_server_keeps_serving(
    served: tuple[PolicyServer, ServerThread], url: str, words: str
) -> None:
    server, thread = served
    bad = {"role": "user", "content": [{"type": "text", "text": "hi"}, image_part(url=url)]}
    response = httpx.post(
        f"{thread.url}/v1/chat/completions",
        json={"model": "default", "messages": [bad]},
        headers=_headers("bad"),
        timeout=60,
    )
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert words in message and "messages[0].content[1]" in message, message
    good = {"role": "user", "content": [image_part(RED)]}
    response = httpx.post(
        f"{thread.url}/v1/chat/completions",
        json={"model": "default", "messages": [good]},
        headers=_headers("bad"),
        timeout=60,
    )
    assert response.status_code == 200, response.text


def test_too_many_images_in_one_call_is_a_400(served: tuple[PolicyServer, ServerThread]) -> None:
    _, thread = served
    content = [image_part(RED) for _ in range(LIMITS.max_images_per_call + 1)]
    response = httpx.post(
        f"{thread.url}/v1/chat/completions",
        json={"model": "default", "messages": [{"role": "user", "content": content}]},
        headers=_headers("many"),
        timeout=60,
    )
    assert response.status_code == 400
    assert "4 images, over this server's limit of 3 per call" in response.json()["error"]["message"]


def test_image_and_text_calls_share_batches_and_sample_as_they_would_alone(tiny_vision_dir: Path) -> None:
    import asyncio

    from policy_server.engines.base import GenerationRequest
    from policy_server.http.images import request_images

    def request(content: Any, seed: int) -> GenerationRequest:
        messages = [{"role": "user", "content": content}]
        return GenerationRequest(messages, max_tokens=4, seed=seed, images=request_images(messages, LIMITS))

    async def run() -> tuple[list[Any], list[Any], int]:
        engine = HFEngine(tiny_vision_dir, max_batch_size=8)
        await engine.start()
        try:
            made = [request([image_part(RED)], 1), request("plain text", 2), request([image_part(BLUE)], 3)]
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
        assert shared.completion_logprobs == single.completion_logprobs  # batch-invariant: to the bit
