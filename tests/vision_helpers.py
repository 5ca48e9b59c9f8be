"""Small images and image content parts for the vision tests."""

from __future__ import annotations

import base64
import io
from typing import Any

import httpx
from PIL import Image

from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER


def image_bytes(color: tuple[int, int, int] = (200, 30, 30), size: int = 64, fmt: str = "PNG") -> bytes:
    """A ``size`` x ``size`` image: a colour field with a white square, encoded as ``fmt``."""
    image = Image.new("RGB", (size, size), color)
    image.paste((255, 255, 255), (size // 4, size // 4, size // 2, size // 2))
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_part(data: bytes | None = None, *, url: str | None = None) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url or data_url(data or image_bytes())}}


def strands_image_block(data: bytes) -> dict[str, Any]:
    """A Strands image content block of PNG bytes."""
    return {"image": {"format": "png", "source": {"bytes": data}}}


def strands_image_history(first: bytes, second: bytes) -> list[dict[str, Any]]:
    """A Strands conversation with an image in the user's message (``first``) and one in a tool result
    (``second``): the tiny model's own tool calls are random text, so the history holds the call."""
    return [
        {"role": "user", "content": [{"text": "What do you see?"}, strands_image_block(first)]},
        {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "look", "input": {}}}]},
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": "t1",
                        "status": "success",
                        "content": [{"text": "view"}, strands_image_block(second)],
                    }
                }
            ],
        },
    ]


# Random weights sample byte-level BPE tokens that may not re-tokenize to themselves (half a UTF-8
# character); this seed's episodes on the tiny VLM sample whole characters, so every turn extends
# the last.
EPISODE_SEED = 6


def picture_episode(
    thread: Any,
    job: str,
    rollout_id: str,
    colors: list[tuple[int, int, int]],
    seed: int = EPISODE_SEED,
    timeout: float = 60,
) -> None:
    """A maze-like episode through a policy server's thread: the first picture in the user message,
    the later ones in tool results, one call per picture (call ``i`` sampled with ``seed + i``)."""
    headers = {JOB_ARN_HEADER: job, TRAJECTORY_ID_HEADER: rollout_id}
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Reach the goal."}, image_part(image_bytes(colors[0]))],
        }
    ]
    for turn, color in enumerate([*colors[1:], None]):
        body = {"model": "default", "messages": messages, "seed": seed + turn, "temperature": 1.0}
        reply = httpx.post(f"{thread.url}/v1/chat/completions", json=body, headers=headers, timeout=timeout)
        assert reply.status_code == 200, reply.text
        if color is None:
            return
        messages.append(
            {"role": "assistant", "content": reply.json()["choices"][0]["message"]["content"] or ""}
        )
        messages.append(
            {"role": "tool", "tool_call_id": f"c{turn}", "content": [image_part(image_bytes(color))]}
        )
