"""Loading a base model to train on: in a stated dtype, dequantised, with the attention its family
trains with.

Every path that trains or merges weights (the GRPO learner, ``rft sft``, ``rft export --merge``)
loads the base here, so none of them leaves to transformers' defaults and to what happens to be
installed whether a quantized checkpoint stays quantized (its weights are then not trainable):

- a checkpoint whose ``config.json`` carries a ``quantization_config`` that transformers can
  dequantise on load (gpt-oss's MXFP4 experts: ``Mxfp4Config(dequantize=True)``) is dequantised to
  the dtype asked for; any other quantized checkpoint is refused with a sentence;
- the attention implementation is the family's ``train_attn_implementation``
  (``policy_server/models/families``; gpt-oss's attention sinks and sliding windows train in
  rftkit's chunked attention, ``policy_server/models/chunked_attention.py``, registered with
  transformers here), or transformers' default for a family that names none;
- what was used (dtype, attention, what the weights were dequantised from) is logged and returned,
  for the run's record.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from policy_server.models import load_model, register_training_attention
from policy_server.models.families import HERMES, Family, family_of

log = logging.getLogger(__name__)

# quant_method values (config.json's quantization_config) transformers dequantises on load, with the
# config that asks it to.
DEQUANTISABLE = ("mxfp4",)


class QuantizedBaseError(ValueError):
    """A base model whose weights would stay quantized (so untrainable) if loaded."""


@dataclass(frozen=True)
class BaseLoad:
    """How a base model was loaded for training."""

    dtype: str  # the weights' dtype, e.g. "bfloat16"
    attn_implementation: str  # what the model's config says it runs, e.g. "eager", "sdpa"
    dequantized_from: str | None = None  # the checkpoint's quant_method, when it was dequantised

    def params(self) -> dict[str, str]:
        """The record of a run's parameters (MLflow params)."""
        return {
            "learner.loaded_dtype": self.dtype,
            "learner.attn_implementation": self.attn_implementation,
            "learner.dequantized_from": self.dequantized_from or "none",
        }

    def describe(self) -> str:
        dequantized = f", dequantised from {self.dequantized_from}" if self.dequantized_from else ""
        return f"{self.dtype}, {self.attn_implementation} attention{dequantized}"


def quant_method(model_dir: str | Path) -> str | None:
    """The ``quant_method`` of ``model_dir``'s config.json quantization_config (None: not quantized)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    quantization = config.get("quantization_config")
    if not quantization:
        return None
    return str(quantization.get("quant_method", "unknown")) if isinstance(quantization, dict) else "unknown"


def training_load_options(
    model_dir: str | Path, dtype: torch.dtype, family: Family | None = None
) -> dict[str, Any]:
    """The ``from_pretrained`` options a base is trained with: ``dtype``, the family's attention
    implementation when it names one, and a dequantising quantization config for a quantized
    checkpoint transformers can dequantise (:class:`QuantizedBaseError` for any other)."""
    options: dict[str, Any] = {"dtype": dtype}
    chosen = family if family is not None else family_of(model_dir) or HERMES
    attention = register_training_attention(chosen.train_attn_implementation)
    if attention is not None:
        options["attn_implementation"] = attention
    method = quant_method(model_dir)
    if method is None:
        return options
    if method not in DEQUANTISABLE:
        raise QuantizedBaseError(
            f"{model_dir} is a quantized checkpoint (quant_method {method!r}); rftkit trains a LoRA "
            f"adapter on dequantised weights and transformers dequantises only "
            f"{', '.join(DEQUANTISABLE)} on load: use the model's unquantized (bfloat16) release, or "
            "dequantise it into a directory of its own and set model to that"
        )
    from transformers import Mxfp4Config

    options["quantization_config"] = Mxfp4Config(dequantize=True)
    return options


def load_for_training(
    model_dir: str | Path, dtype: torch.dtype, *, family: Family | None = None, **placed: Any
) -> tuple[Any, BaseLoad]:
    """``model_dir``'s model loaded as :func:`training_load_options` says (``placed``: e.g. a
    device_map), checked to hold no quantized weights, and how it was loaded."""
    options = training_load_options(model_dir, dtype, family)
    model = load_model(model_dir, **options, **placed)
    if getattr(model, "is_quantized", False) or getattr(model, "hf_quantizer", None) is not None:
        raise QuantizedBaseError(
            f"{model_dir} loaded with quantized weights although rftkit asked transformers to "
            "dequantise them: check the installed transformers (constraints.txt) or use the model's "
            "unquantized release"
        )
    attention = model.config.get_text_config()._attn_implementation
    loaded = BaseLoad(
        dtype=str(dtype).removeprefix("torch."),
        attn_implementation=str(attention),
        dequantized_from=quant_method(model_dir),
    )
    log.info("base model %s loaded for training: %s", model_dir, loaded.describe())
    return model, loaded
