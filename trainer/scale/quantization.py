"""A checkpoint's own quantization (config.json's ``quantization_config``) and what the weights take
in vLLM, which serves the checkpoint as it is stored: quantized layers at their bits, the modules the
config leaves unconverted (``modules_to_not_convert``) and the embeddings in the model's dtype.

The learner does not serve the checkpoint: it loads it dequantized (gpt-oss's MXFP4 experts become
bfloat16 for training), so its weights are counted at the learner's dtype in
:mod:`trainer.scale.learner_memory`.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Any

# Bits a weight takes, scales included, for the methods whose width the method alone fixes: MXFP4 is
# 4-bit values with one 8-bit scale per 32 (4.25); FP8 a byte with per-tensor or per-channel scales.
FIXED_BITS = {"mxfp4": 4.25, "fp8": 8.0, "fbgemm_fp8": 8.0}
# Methods that name their width in ``bits`` (GPTQ, AWQ and their kernels' names), with a 16-bit scale
# and a packed zero point per ``group_size`` weights.
GROUPED = ("gptq", "awq", "awq_marlin", "gptq_marlin", "auto-round", "hqq")
# What every method leaves in the model's dtype: the embeddings and the output head.
ALWAYS_KEPT = ("model.embed_tokens", "lm_head")


@dataclass(frozen=True)
class Quantization:
    """How a checkpoint stores its weights: ``method`` at ``bits`` per weight, except the modules
    ``keep`` names (fnmatch patterns over module names, ``model.layers.*.self_attn``)."""

    method: str
    bits: float
    keep: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Quantization | None:
        """The ``quantization_config`` of a config.json; None for an unquantized checkpoint. A method
        whose width rftkit does not know is counted at 16 bits (an upper bound for what vLLM serves)."""
        found = config.get("quantization_config") or (config.get("text_config") or {}).get(
            "quantization_config"
        )
        if not found:
            return None
        method = str(found.get("quant_method", "")).lower()
        keep = tuple(found.get("modules_to_not_convert") or found.get("ignore") or ())
        return cls(method, _bits(method, found), keep)

    def keeps(self, module: str) -> bool:
        """Whether ``module`` (e.g. ``model.layers.0.mlp.router``) stays in the model's dtype."""
        patterns = (*ALWAYS_KEPT, *self.keep)
        return any(fnmatch(module, pattern) or fnmatch(module, pattern + ".*") for pattern in patterns)

    def label(self) -> str:
        return f"{self.method}, {self.bits:g} bits"


def _bits(method: str, found: dict[str, Any]) -> float:
    if method in FIXED_BITS:
        return FIXED_BITS[method]
    if method in GROUPED:
        group = int(found.get("group_size") or 128)
        return float(found.get("bits") or found.get("w_bit") or 4) + (32 / group if group > 0 else 0)
    if method == "modelopt":
        # NVIDIA ModelOpt: NVFP4 is 4-bit values with an 8-bit scale per 16 (4.5); else FP8.
        return 4.5 if "FP4" in str(found.get("quant_algo", "")).upper() else 8.0
    if method == "bitsandbytes":
        # 4-bit NF4/FP4 with a float32 scale per 64 weights (4.5); else LLM.int8's byte.
        return 4.5 if found.get("load_in_4bit") else 8.0
    if method == "compressed-tensors":
        groups = found.get("config_groups") or {}
        widths = [int(group["weights"]["num_bits"]) for group in groups.values() if group.get("weights")]
        return float(max(widths)) if widths else 16.0
    return 16.0
