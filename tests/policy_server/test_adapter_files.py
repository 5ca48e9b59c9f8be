"""An adapter's files as they travel to Ray replicas: as written, or cast to the serving dtype."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load, save_file

from policy_server.engines.adapter_files import read_adapter, write_adapter


def _adapter(directory: Path) -> dict[str, torch.Tensor]:
    directory.mkdir()
    (directory / "adapter_config.json").write_text(json.dumps({"r": 4, "peft_type": "LORA"}))
    tensors = {
        "lora_A.weight": torch.randn(4, 64, generator=torch.Generator().manual_seed(0)),
        # Over ATen's grain size, not a multiple of it: cast in slices, the last one short.
        "lora_B.weight": torch.randn(5000, 8, generator=torch.Generator().manual_seed(1)),
        "steps": torch.tensor([3, 7]),  # not floating point: left alone
    }
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    return tensors


def test_files_travel_as_written_without_a_serving_dtype(tmp_path: Path) -> None:
    _adapter(tmp_path / "adapter")
    files = read_adapter(tmp_path / "adapter")
    assert files == read_adapter(tmp_path / "adapter", "float32")
    copy = write_adapter(files, tmp_path / "copy")
    assert (copy / "adapter_model.safetensors").read_bytes() == files["adapter_model.safetensors"]


def test_a_serving_dtype_casts_the_weights_and_halves_them(tmp_path: Path) -> None:
    tensors = _adapter(tmp_path / "adapter")
    written = read_adapter(tmp_path / "adapter")
    cast = read_adapter(tmp_path / "adapter", "bfloat16")
    assert cast["adapter_config.json"] == written["adapter_config.json"]
    loaded = load(cast["adapter_model.safetensors"])
    for name in ("lora_A.weight", "lora_B.weight"):
        assert loaded[name].dtype == torch.bfloat16
        assert torch.equal(loaded[name], tensors[name].to(torch.bfloat16))
    assert torch.equal(loaded["steps"], tensors["steps"])
    assert len(cast["adapter_model.safetensors"]) < 0.6 * len(written["adapter_model.safetensors"])


def test_a_directory_without_a_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no adapter_config.json"):
        read_adapter(tmp_path, "bfloat16")
