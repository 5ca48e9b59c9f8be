"""The one check every command makes of a model path: a local transformers directory, never a hub id.

transformers takes a path that does not exist for a hub id and retries the hub for half a minute before
an ``OSError`` traceback; rftkit loads nothing from a hub, so a mistyped path is refused at once.
"""

from __future__ import annotations

from pathlib import Path

BUILD_HINT = (
    "rftkit loads models from local directories only, never from a hub; `rft model tiny|tiny-vision|"
    "smollm2 DIR` writes one"
)


class LocalModelError(ValueError):
    """The model path is not a local transformers directory; the message names the path."""


def local_model_dir(path: str | Path) -> Path:
    """``path`` as a directory holding a ``config.json``, else :class:`LocalModelError`."""
    directory = Path(path).expanduser()
    if not directory.exists():
        raise LocalModelError(f"the model directory {directory} does not exist ({BUILD_HINT})")
    if not (directory / "config.json").is_file():
        raise LocalModelError(f"{directory} is not a model directory: it has no config.json ({BUILD_HINT})")
    return directory
