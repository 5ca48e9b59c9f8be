"""Small images and image content parts for the vision tests."""

from __future__ import annotations

import base64
import io
from typing import Any

from PIL import Image


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
