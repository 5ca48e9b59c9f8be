"""Writing an export: the adapter in the base model's dtype (peft format, for vLLM's ``--lora-modules``)
or, merged, full weights with the tokenizer and chat template (a plain model directory). The export is
written beside ``OUT``, checked against the trained policy (:mod:`trainer.export.verify`) and only then
renamed to ``OUT``, so a failed export leaves nothing that looks usable."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from policy_server.models import chat_template_text, load_model, load_tokenizer
from trainer.export.card import write_card
from trainer.export.source import ADAPTER_CONFIG, ExportError, ExportSource
from trainer.export.verify import TOLERANCES, Verification, compare, decode, prompt_ids
from trainer.learner.base_load import load_for_training

ADAPTER_WEIGHTS = "adapter_model.safetensors"
# Files of the base model directory a merged export does not copy: save_pretrained writes its own.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_WRITTEN_BY_SAVE = ("config.json", "generation_config.json", "model.safetensors.index.json")


def base_dtype(model_dir: Path) -> torch.dtype:
    """The dtype the base model's ``config.json`` names (float32 when it names none rftkit exports)."""
    config = json.loads((model_dir / "config.json").read_text())
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    dtype = getattr(torch, str(name), None)
    return dtype if isinstance(dtype, torch.dtype) and dtype in TOLERANCES else torch.float32


def _policy(source: ExportSource, dtype: torch.dtype) -> Any:
    """The trained policy: the base in ``dtype`` with the adapter as saved, as the hf engine loads it."""
    from peft import PeftModel

    # Loaded as the learner loads it (dequantised, the family's attention): merged weights are dense.
    base, _ = load_for_training(source.base_model, dtype)
    return PeftModel.from_pretrained(base, str(source.adapter_dir))


def _write_adapter(source: ExportSource, out: Path, dtype: torch.dtype) -> None:
    from safetensors.torch import load_file, save_file

    weights = source.adapter_dir / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise ExportError(
            f"{source.adapter_dir} has no {ADAPTER_WEIGHTS}: it is not an adapter rftkit wrote."
        )
    tensors = {name: tensor.to(dtype).contiguous() for name, tensor in load_file(str(weights)).items()}
    save_file(tensors, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config = json.loads((source.adapter_dir / ADAPTER_CONFIG).read_text())
    config["base_model_name_or_path"] = str(source.base_model)
    (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))
    if source.chat_template is not None:
        # vLLM renders with the base's tokenizer: a template the run set travels as a file to pass it.
        (out / "chat_template.jinja").write_text(chat_template_text(source.chat_template) + "\n")


def _write_merged(policy: Any, source: ExportSource, out: Path) -> None:
    """The adapter merged into the base (peft's merge_and_unload), with the base's tokenizer files,
    processor files and the run's chat template."""
    for path in source.base_model.iterdir():
        if path.is_file() and not path.name.endswith(_WEIGHT_SUFFIXES) and path.name not in _WRITTEN_BY_SAVE:
            shutil.copy2(path, out / path.name)
    policy.merge_and_unload().save_pretrained(str(out))
    load_tokenizer(source.base_model, source.chat_template).save_pretrained(str(out))


def _exported_model(source: ExportSource, staging: Path, merge: bool, dtype: torch.dtype) -> Any:
    """The export as a server loads it: the merged directory alone, or the base with the exported adapter."""
    if merge:
        return load_model(staging, dtype=dtype)
    from peft import PeftModel

    return PeftModel.from_pretrained(load_model(source.base_model, dtype=dtype), str(staging))


def _check_tokenizer(staging: Path, prompts: list[list[int]]) -> None:
    if prompt_ids(load_tokenizer(staging)) != prompts:
        raise ExportError(
            "The merged model's tokenizer renders the check prompts differently from the trained "
            "policy's; its chat template did not travel (a bug: please report it)."
        )


def export(source: ExportSource, out: Path, *, merge: bool, tolerance: float | None = None) -> Verification:
    """Write ``source`` to ``out`` (merged when ``merge``), checked against the trained policy."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} already exists and is not empty: name a new directory.")
    dtype = base_dtype(source.base_model)
    tolerance = TOLERANCES[dtype] if tolerance is None else tolerance
    prompts = prompt_ids(load_tokenizer(source.base_model, source.chat_template))
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        policy = _policy(source, dtype)
        reference = decode(policy, prompts)
        if merge:
            _write_merged(policy, source, staging)
            _check_tokenizer(staging, prompts)
        else:
            _write_adapter(source, staging, dtype)
        del policy
        what = "The merged model" if merge else f"The adapter in {str(dtype).removeprefix('torch.')}"
        try:
            verification = compare(reference, _exported_model(source, staging, merge, dtype), tolerance, what)
        except ValueError as error:
            raise ExportError(f"{error}; nothing was written to {out}.") from None
        write_card(staging, out, source, merge=merge, dtype=dtype, verification=verification)
        if out.exists():
            out.rmdir()
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return verification
