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
