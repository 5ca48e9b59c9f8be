"""A peft adapter directory as bytes and back: what travels through Ray's object store to replicas."""

from __future__ import annotations

from pathlib import Path

AdapterFiles = dict[str, bytes]  # relative path -> contents


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
        name: tensor.to(target) if tensor.is_floating_point() else tensor
        for name, tensor in load(data).items()
    }
    return save(tensors, metadata={"format": "pt"})


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
