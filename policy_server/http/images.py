"""Images in chat calls: the one data model every part of rftkit shares, from the gateway to the learner.

Agents send images as OpenAI content parts, ``{"type": "image_url", "image_url": {"url":
"data:image/png;base64,..."}}``, in user messages and in tool results. The gateway decodes and
validates each one here (:func:`request_images`) before any engine sees the call:

- only ``data:`` URLs: the server fetches nothing (a remote ``http(s)://`` URL is refused);
- the base64 must decode, to at most ``max_image_bytes`` bytes, and be a PNG, JPEG or WebP file
  that Pillow opens, with at least one pixel and at most ``max_image_pixels`` of them;
- at most ``max_images_per_call`` images per call (counted over the whole conversation: a
  multi-turn episode re-sends its earlier images with every call).

Each image is then an :class:`ImageInput`: the file's bytes as sent, its format, size and sha256.
The sha256 names the image everywhere after: the trace's :class:`ImageRef` (which image, where its
placeholder tokens sit in the prompt) and the run's content-addressed store (``image_store.py``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

FORMATS = ("PNG", "JPEG", "WEBP")
_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?);base64,", re.ASCII)

DEFAULT_MAX_IMAGE_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_IMAGES_PER_CALL = 16
DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096


class ImageError(ValueError):
    """An image part the server will not take; the message is the sentence the caller gets."""


@dataclass(frozen=True)
class ImageLimits:
    """What one call's images may be (the policy server's ``max_image*`` settings)."""

    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_images_per_call: int = DEFAULT_MAX_IMAGES_PER_CALL
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS


@dataclass(frozen=True)
class ImageInput:
    """One decoded, validated image of a call: the encoded file's bytes and what they hold."""

    data: bytes = field(repr=False)
    format: str  # one of FORMATS
    width: int
    height: int
    sha256: str

    def to_pil(self) -> Any:
        """The image as an RGB ``PIL.Image`` (what image processors take)."""
        from PIL import Image

        with Image.open(io.BytesIO(self.data)) as image:
            return image.convert("RGB")


class ImageRef(BaseModel):
    """Where one image sits in a call's prompt: its sha256 and its run of placeholder tokens.

    ``start`` is the index in ``prompt_token_ids`` of the image's first placeholder token
    (``<|image_pad|>`` for Qwen2-VL) and ``length`` the number of them, exactly as the model saw them.
    """

    sha256: str = Field(description="Hex sha256 of the image file's bytes; its name in the image store.")
    start: int = Field(ge=0, description="Index of the image's first placeholder token in the prompt.")
    length: int = Field(ge=1, description="Number of placeholder tokens the image took.")


def image_from_bytes(data: bytes, limits: ImageLimits, where: str = "image") -> ImageInput:
    """Validate an image file's bytes (format, size, pixel count) into an :class:`ImageInput`."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise ImageError(f"The {where} is empty (0 bytes); send a PNG, JPEG or WebP file.")
    if len(data) > limits.max_image_bytes:
        raise ImageError(
            f"The {where} is {len(data)} bytes, over this server's limit of {limits.max_image_bytes} "
            "bytes per image; send a smaller image."
        )
    try:
        with Image.open(io.BytesIO(data)) as image:
            kind, (width, height) = image.format, image.size
            if kind in FORMATS and 0 < width * height <= limits.max_image_pixels:
                image.load()  # decode now: a truncated file fails here, not inside an engine
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as error:
        raise ImageError(f"The {where} is not an image Pillow can decode ({error}).") from None
    if kind not in FORMATS:
        raise ImageError(f"The {where} is a {kind} file; send PNG, JPEG or WebP.")
    if width * height == 0:
        raise ImageError(f"The {where} has no pixels ({width}x{height}).")
    if width * height > limits.max_image_pixels:
        raise ImageError(
            f"The {where} is {width}x{height} = {width * height} pixels, over this server's limit of "
            f"{limits.max_image_pixels} pixels per image; send a smaller image."
        )
    return ImageInput(data, kind, width, height, hashlib.sha256(data).hexdigest())


def image_from_url(url: str, limits: ImageLimits, where: str = "image") -> ImageInput:
    """Decode and validate a ``data:<mime>;base64,...`` URL; anything else is an :class:`ImageError`."""
    if url.startswith(("http://", "https://")):
        raise ImageError(
            f"The {where} is a remote URL ({url[:64]}); this server fetches nothing: send the image "
            "inline as a data:image/png;base64,... URL."
        )
    match = _DATA_URL.match(url)
    if match is None:
        raise ImageError(
            f"The {where} URL is not a base64 data URL; send data:image/png;base64,... (or jpeg, webp)."
        )
    payload = url[match.end() :]
    # A base64 payload decodes to 3/4 of its length: refuse an oversized one before decoding it.
    if len(payload) * 3 // 4 > limits.max_image_bytes + 3:
        raise ImageError(
            f"The {where} is about {len(payload) * 3 // 4} bytes, over this server's limit of "
            f"{limits.max_image_bytes} bytes per image; send a smaller image."
        )
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(f"The {where}'s base64 data does not decode; check its encoding.") from None
    return image_from_bytes(data, limits, where)


def image_parts(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(where, url)`` of every image part of ``messages``, in prompt order."""
    found = []
    for index, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for number, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "image_url":
                url = (part.get("image_url") or {}).get("url", "")
                found.append((f"image in messages[{index}].content[{number}]", url))
    return found


def request_images(messages: list[dict[str, Any]], limits: ImageLimits) -> list[ImageInput]:
    """The validated images of a call's messages, in prompt order (raises :class:`ImageError`)."""
    parts = image_parts(messages)
    if len(parts) > limits.max_images_per_call:
        raise ImageError(
            f"This call carries {len(parts)} images, over this server's limit of "
            f"{limits.max_images_per_call} per call (earlier turns' images count too)."
        )
    return [image_from_url(url, limits, where) for where, url in parts]


def locate_images(prompt_ids: list[int], image_token_id: int, images: list[ImageInput]) -> list[ImageRef]:
    """The :class:`ImageRef` of each image: the runs of ``image_token_id`` in the prompt, in order.

    Two images never form one run (the template puts start and end tokens around each). Raises
    ``ValueError`` when the runs and the images do not pair up: the engine fed the model something
    other than what was validated.
    """
    runs: list[tuple[int, int]] = []
    for index, token in enumerate(prompt_ids):
        if token != image_token_id:
            continue
        if runs and runs[-1][0] + runs[-1][1] == index:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((index, 1))
    if len(runs) != len(images):
        raise ValueError(f"the prompt has {len(runs)} image placeholder runs for {len(images)} images")
    return [
        ImageRef(sha256=image.sha256, start=start, length=length)
        for image, (start, length) in zip(images, runs, strict=True)
    ]
