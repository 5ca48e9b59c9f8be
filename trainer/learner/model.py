"""The learner's model: the base causal LM (or vision-language model) with a peft LoRA adapter, and
the warm start loaded a second time, frozen, when it is the KL reference."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from policy_server.models import is_vision_model
from trainer.learner.base_load import BaseLoad, load_for_training
from trainer.learner.vision import freeze_vision_outside_scope, lora_targets

if TYPE_CHECKING:
    from trainer.config import TrainConfig

logger = logging.getLogger(__name__)

TRAINED_ADAPTER = "default"  # peft's name for the adapter it creates or loads first
REFERENCE_ADAPTER = "reference"


class LoraTargetError(ValueError):
    """A LoRA setting that names nothing in the model."""


def build_model(
    model_dir: str | Path, config: TrainConfig, device: torch.device, dtype: torch.dtype
) -> tuple[Any, str | None, BaseLoad]:
    """The base model with its trainable adapter (fresh, or ``init_adapter``), the name of the
    frozen reference adapter when the KL reference is the warm start (else None: the base model),
    and how the base was loaded (dtype, attention, dequantisation: :mod:`trainer.learner.base_load`)."""
    from peft import LoraConfig, PeftModel

    placed: dict[str, Any] = {"device_map": {"": str(device)}} if device.type == "cuda" else {}
    base, loaded = load_for_training(model_dir, dtype, **placed)
    if config.learner.gradient_checkpointing:
        base.config.use_cache = False
        enable_checkpointing(base)
    reference_adapter: str | None = None
    # autocast_adapter_dtype: a bf16/fp16 base still gets float32 LoRA weights (and so float32
    # gradients and AdamW state): bf16 updates of small weights round away.
    if config.init_adapter is None:
        targets = config.lora.target_modules
        if is_vision_model(base.config):
            targets = lora_targets(base, config.lora)  # the language model's unless widened
        check_target_parameters(base, config.lora.target_parameters, model_dir)
        lora = LoraConfig(
            r=config.lora.r,
            lora_alpha=config.lora.lora_alpha,
            lora_dropout=config.lora.lora_dropout,
            target_modules=targets,
            target_parameters=list(config.lora.target_parameters) or None,
            task_type="CAUSAL_LM",
        )
        return _with_adapter(base, lora, model_dir), reference_adapter, loaded
    model = PeftModel.from_pretrained(
        base, str(config.init_adapter), is_trainable=True, autocast_adapter_dtype=True
    )
    if config.beta > 0.0:
        model.load_adapter(
            str(config.init_adapter),
            adapter_name=REFERENCE_ADAPTER,
            is_trainable=False,
            autocast_adapter_dtype=True,
        )
        model.set_adapter(TRAINED_ADAPTER)
        reference_adapter = REFERENCE_ADAPTER
    if is_vision_model(base.config):
        # After set_adapter, which marks the whole trained adapter trainable again.
        frozen = freeze_vision_outside_scope(model, config.lora)
        if frozen:
            logger.info(
                "init_adapter: %d LoRA tensors of the vision tower stay as loaded (lora.adapt_vision %r)",
                frozen,
                config.lora.adapt_vision,
            )
    return model, reference_adapter, loaded


def _with_adapter(base: Any, lora: Any, model_dir: str | Path) -> Any:
    """``base`` with a fresh adapter of peft config ``lora``; peft's refusal of dropout on
    parameters (which it also applies to the expert stacks it maps target_modules onto, as
    Qwen3-MoE's) as a sentence naming the setting."""
    from peft import get_peft_model

    try:
        return get_peft_model(base, lora, autocast_adapter_dtype=True)
    except ValueError as error:
        if "lora_dropout" not in str(error):
            raise
        raise LoraTargetError(
            f"LoRA adapts parameters of {model_dir} (its experts: lora.target_parameters names them, or "
            "peft maps lora.target_modules onto them for this model), which take no dropout: set "
            "lora.lora_dropout: 0"
        ) from error


def check_target_parameters(model: Any, names: list[str], model_dir: str | Path) -> None:
    """:class:`LoraTargetError` when a name of ``lora.target_parameters`` matches no parameter of
    ``model`` (peft's rule: the full name, or a suffix after a dot); peft itself only warns."""
    params = [name for name, _ in model.named_parameters()]
    missing = [wanted for wanted in names if not any(p == wanted or p.endswith(f".{wanted}") for p in params)]
    if not missing:
        return
    # One layer's stacked (3-D) parameters, named as target_parameters takes them.
    stacked = sorted(
        {re.sub(r"^.*?\.\d+\.", "", name) for name, param in model.named_parameters() if param.dim() == 3}
    )
    have = (
        f"its stacked expert parameters are {', '.join(stacked)}"
        if stacked
        else "it has no stacked (3-D) expert parameters; target_modules names its linear layers"
    )
    raise LoraTargetError(
        f"lora.target_parameters names {', '.join(missing)}, which match no parameter of {model_dir}: {have}"
    )


def enable_checkpointing(model: Any) -> None:
    """Activation (gradient) checkpointing on ``model``, non-reentrant: gradients reach the LoRA
    weights although the frozen embeddings' output does not require grad.

    transformers renamed ``gradient_checkpointing_enable`` to ``activation_checkpointing_enable``
    during 5.x; an older one (a GPU machine's) has only the first.
    """
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def rng_devices(device: torch.device) -> list[int]:
    """The CUDA devices whose generators ``fork_rng`` must save around a step on ``device``.

    A step reseeds with ``torch.manual_seed``, which reseeds every CUDA device's generator too: on
    CUDA all of them are saved and restored (the caller's sampling, e.g. an hf engine on another
    GPU, draws on as if no step ran); on the CPU none (no CUDA state is touched or initialised).
    """
    if device.type != "cuda":
        return []
    return list(range(torch.cuda.device_count()))
