"""policy_server/http/images.py and image_store.py: every image part is decoded and checked, or refused
with a sentence; images are stored once per content and removed with the last trace using them."""

from __future__ import annotations

import base64
import gc
import hashlib
from pathlib import Path

import pytest

from policy_server.http.images import (
    ImageError,
    ImageLimits,
    image_from_url,
    locate_images,
    request_images,
)
from policy_server.image_store import ImageStore, trace_key
from tests.vision_helpers import data_url, image_bytes, image_part

LIMITS = ImageLimits(max_image_bytes=64 * 1024, max_images_per_call=3, max_image_pixels=256 * 256)


@pytest.mark.parametrize(
    ("fmt", "mime"), [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp")]
)
def test_png_jpeg_and_webp_decode_with_their_hash_and_size(fmt: str, mime: str) -> None:
    data = image_bytes(size=48, fmt=fmt)
    image = image_from_url(data_url(data, mime), LIMITS)
    assert (image.format, image.width, image.height) == (fmt, 48, 48)
    assert image.sha256 == hashlib.sha256(data).hexdigest()
    assert image.to_pil().size == (48, 48)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("data:image/png;base64,@@not*base64@@", "does not decode"),
        ("http://example.com/cat.png", "fetches nothing"),
        ("https://example.com/cat.png", "fetches nothing"),
        ("data:image/png;base64,", "empty (0 bytes)"),
        ("file:///etc/passwd", "not a base64 data URL"),
        (data_url(b"plain text, not an image"), "not an image Pillow can decode"),
        (data_url(image_bytes(fmt="GIF"), "image/gif"), "GIF file"),
        (data_url(image_bytes(fmt="PNG")[:60]), "not an image Pillow can decode"),  # truncated
        (data_url(image_bytes(size=300)), "pixels, over this server's limit"),
        ("data:image/png;base64," + base64.b64encode(bytes(70 * 1024)).decode(), "bytes per image"),
    ],
)
def test_bad_images_are_refused_with_a_sentence(url: str, words: str) -> None:
    with pytest.raises(ImageError) as raised:
        image_from_url(url, LIMITS, "image in messages[0].content[1]")
    message = str(raised.value)
    assert words in message and message.startswith("The image in messages[0].content[1]"), message


def test_images_are_taken_in_prompt_order_and_counted_per_call() -> None:
    red, blue = image_bytes((200, 0, 0)), image_bytes((0, 0, 200))
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "look"}, image_part(red)]},
        {"role": "assistant", "content": "ok"},
        {"role": "tool", "content": [image_part(blue), {"type": "text", "text": "after"}]},
    ]
    images = request_images(messages, LIMITS)
    assert [image.sha256 for image in images] == [hashlib.sha256(d).hexdigest() for d in (red, blue)]
    messages.append({"role": "user", "content": [image_part(red), image_part(red)]})
    with pytest.raises(ImageError, match="4 images, over this server's limit of 3 per call"):
        request_images(messages, LIMITS)


def test_locate_images_pairs_placeholder_runs_with_images() -> None:
    images = request_images([{"role": "user", "content": [image_part(), image_part()]}], LIMITS)
    refs = locate_images([5, 9, 9, 9, 6, 7, 5, 9, 9, 6], 9, images)
    assert [(ref.start, ref.length) for ref in refs] == [(1, 3), (7, 2)]
    with pytest.raises(ValueError, match="1 image placeholder runs for 2 images"):
        locate_images([9, 9, 1], 9, images)


def test_store_keeps_one_file_per_image_until_its_last_trace_is_released(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "images")
    red, blue = (image_from_url(data_url(image_bytes(c)), LIMITS) for c in [(200, 0, 0), (0, 0, 200)])
    first, second = trace_key("job", "r1"), trace_key("job", "r2")
    for _ in range(3):  # a multi-turn episode re-sends its image with every call
        store.put(red, first)
    store.put(red, second)
    store.put(blue, second)
    assert sorted(p.name for p in (tmp_path / "images").iterdir()) == sorted([red.sha256, blue.sha256])
    assert store.image(red.sha256).data == red.data
    store.release(second)
    assert [p.name for p in (tmp_path / "images").iterdir()] == [red.sha256]  # r1 still uses it
    store.release(first)
    assert list((tmp_path / "images").iterdir()) == [] and len(store) == 0
    with pytest.raises(FileNotFoundError):
        store.image(red.sha256)
    with pytest.raises(ValueError, match="not a hex sha256"):
        store.image("../../etc/passwd")


def test_a_temporary_store_makes_its_directory_at_its_first_image_and_removes_it_after() -> None:
    """A text-only server (most runs) leaves no directory behind, even when it is killed."""
    store = ImageStore.temporary()
    root = store.root
    assert root.name.startswith("rftkit-images-") and not root.exists()
    store.put(image_from_url(data_url(image_bytes((0, 200, 0))), LIMITS), trace_key("job", "r1"))
    assert root.is_dir()
    del store
    gc.collect()
    assert not root.exists()
