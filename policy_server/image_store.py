"""The run's images, stored once each by content hash, for as long as a trace refers to them.

A multi-turn episode re-sends its earlier images with every call, and a group of rollouts often
shares its first image: traces therefore hold only :class:`~policy_server.http.images.ImageRef` (a sha256
and a span of prompt tokens) and the bytes live here, one file per distinct image, named by its
sha256 (``<root>/<sha256>``, the file exactly as the agent sent it). Each file remembers which traces
refer to it; :meth:`ImageStore.release` (when the trainer is done with a trace) deletes the files
no remaining trace refers to. The learner reads the images back with :meth:`ImageStore.image`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import uuid
import weakref
from pathlib import Path

from policy_server.http.images import ImageInput, ImageLimits, image_from_bytes

_UNLIMITED = ImageLimits(max_image_bytes=1 << 62, max_images_per_call=1 << 62, max_image_pixels=1 << 62)


def trace_key(job_arn: str, rollout_id: str) -> str:
    """The name a trace's references go by in the store."""
    return f"{job_arn}\n{rollout_id}"


class ImageStore:
    """Content-addressed image files under ``root``, reference-counted by trace (thread-safe)."""

    def __init__(self, root: str | Path) -> None:
        # The directory is made by the first image, so a text-only run leaves none behind.
        self.root = Path(root)
        self._lock = threading.Lock()
        self._refs: dict[str, set[str]] = {}  # sha256 -> trace keys
        self._by_key: dict[str, set[str]] = {}  # trace key -> sha256s

    @classmethod
    def temporary(cls) -> ImageStore:
        """A store in a fresh temporary directory, made by its first image (so a text-only server,
        even one killed, leaves nothing behind) and removed when the store is garbage-collected."""
        store = cls(Path(tempfile.gettempdir()) / f"rftkit-images-{uuid.uuid4().hex}")
        weakref.finalize(store, shutil.rmtree, str(store.root), True)
        return store

    def path(self, sha256: str) -> Path:
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise ValueError(f"{sha256!r} is not a hex sha256")
        return self.root / sha256

    def put(self, image: ImageInput, key: str) -> Path:
        """Store ``image`` (once per content) and note that trace ``key`` refers to it."""
        path = self.path(image.sha256)
        with self._lock:
            if not path.exists():
                self.root.mkdir(parents=True, exist_ok=True)
                partial = path.with_name(f".{image.sha256}.{os.getpid()}.{threading.get_ident()}")
                partial.write_bytes(image.data)
                partial.replace(path)  # atomic: a reader never sees half a file
            self._refs.setdefault(image.sha256, set()).add(key)
            self._by_key.setdefault(key, set()).add(image.sha256)
        return path

    def image(self, sha256: str) -> ImageInput:
        """The stored image ``sha256``; raises ``FileNotFoundError`` if its traces were released."""
        data = self.path(sha256).read_bytes()
        if hashlib.sha256(data).hexdigest() != sha256:
            raise ValueError(f"the stored image {sha256} does not match its hash: the file was altered")
        return image_from_bytes(data, _UNLIMITED, f"stored image {sha256}")

    def release(self, key: str) -> None:
        """Trace ``key`` is done with: delete the images no other trace refers to."""
        with self._lock:
            for sha256 in self._by_key.pop(key, set()):
                holders = self._refs.get(sha256, set())
                holders.discard(key)
                if not holders:
                    self._refs.pop(sha256, None)
                    self.path(sha256).unlink(missing_ok=True)

    def __len__(self) -> int:
        with self._lock:
            return len(self._refs)
