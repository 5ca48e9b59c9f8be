"""Writing a model directory that transformers, peft and vLLM's own transformers all load: what the
tiny builders and the SmolLM2 conversion share."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def plain_tokenizer_class(out: Path) -> None:
    """Name the tokenizer's class ``PreTrainedTokenizerFast`` in ``out/tokenizer_config.json``:
    transformers 5 writes ``TokenizersBackend``, a class other stacks (vLLM's transformers) lack."""
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def save_random_model(
    model_class: Any,
    config: Any,
    out: Path,
    *,
    seed: int,
    eos_token_ids: list[int],
    pad_token_id: int,
    bos_token_id: int | None = None,
) -> Path:
    """``model_class(config)`` initialised from ``seed`` (the caller's random state left as it was),
    in float32, saved to ``out`` with a generation config that stops at ``eos_token_ids``."""
    import torch
    from transformers import GenerationConfig

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_token_ids, pad_token_id=pad_token_id, bos_token_id=bos_token_id
    )
    model.save_pretrained(out, safe_serialization=True)
    return out
