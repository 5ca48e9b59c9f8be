"""A peft adapter directory as bytes and back: what travels through Ray's object store to replicas."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

AdapterFiles = dict[str, bytes]  # relative path -> contents
# ATen's grain size: an elementwise kernel over fewer elements runs on the calling thread alone.
_SERIAL_ELEMENTS = 32768


def read_adapter(directory: str | Path, dtype: str | None = None) -> AdapterFiles:
    """Every file under ``directory`` (a peft adapter: adapter_config.json and its weights); with
    ``dtype`` (the dtype the engine serves adapters in), its safetensors' floating-point tensors cast
    to it, so a float32 adapter travels at half the size to an engine that would cast it anyway."""
    root = Path(directory)
    if not (root / "adapter_config.json").is_file():
        raise ValueError(f"{root} is not a peft adapter directory (no adapter_config.json in it)")
    files = {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }
    if dtype is None or dtype == "float32":
        return files
    return {
        name: _cast(data, dtype) if name.endswith(".safetensors") else data for name, data in files.items()
    }


def _cast(data: bytes, dtype: str) -> bytes:
    import torch
    from safetensors.torch import load, save

    target = getattr(torch, dtype)
    tensors = {
        name: _converted(tensor, target) if tensor.is_floating_point() else tensor
        for name, tensor in load(data).items()
    }
    return save(tensors, metadata={"format": "pt"})


def _converted(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` in ``dtype``, converted on this thread a slice of ATen's grain size at a time.

    A conversion above the grain size opens an OpenMP parallel region, which waits for every thread of
    the pool: on cores busy with other work each region can wait a scheduler's time slice, and an
    adapter has hundreds of tensors. The conversion is bound by memory, so one thread loses little."""
    import torch

    converted = torch.empty(tensor.shape, dtype=dtype)
    source, target = tensor.reshape(-1), converted.view(-1)
    for start in range(0, source.numel(), _SERIAL_ELEMENTS):
        target[start : start + _SERIAL_ELEMENTS].copy_(source[start : start + _SERIAL_ELEMENTS])
    return converted


def write_adapter(files: AdapterFiles, directory: str | Path) -> Path:
    """Write ``files`` under ``directory`` (created); refuses paths that would leave it."""
    root = Path(directory).resolve()
    for name, data in files.items():
        target = (root / name).resolve()
        if not target.is_relative_to(root):
            raise ValueError(f"adapter file name {name!r} leads outside the adapter directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return root
