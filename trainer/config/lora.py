"""The LoRA adapter section."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from trainer.config.common import _Section


def vision_lora_refusal(adapt_vision: str, engine: str) -> str | None:
    """Why ``engine`` cannot serve an adapter on vision layers (``adapt_vision`` other than none), or
    None; ``rft train``, ``rft plan`` (config validation) and ``rft demo --vision`` refuse by it.

    vLLM applies a LoRA adapter to the language model only: its vision tower and projector run without
    it, so the policy it samples would not be the one the learner trains (the hf engine applies all).
    """
    if engine != "vllm" or adapt_vision == "none":
        return None
    return (
        f"lora.adapt_vision: {adapt_vision} with engine: vllm: vLLM applies LoRA to the language model "
        "only, not to the vision tower or its projector, so it would sample from another policy than "
        "the one trained; keep the vision layers frozen (lora.adapt_vision: none) or use engine: hf"
    )


class LoraConfig(_Section):
    """The LoRA adapter that training updates (peft's names)."""

    r: int = Field(default=16, gt=0, description="Adapter rank.")
    lora_alpha: float = Field(
        default=32.0, gt=0, description="Scaling numerator: updates scale by alpha / r."
    )
    lora_dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout on the adapter's input.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        default="all-linear",
        description="Module names to adapt (e.g. [q_proj, v_proj]), or 'all-linear' for every linear "
        "layer except the output head. In a vision-language model, of the parts adapt_vision names.",
    )
    target_parameters: list[str] = Field(
        default_factory=list,
        description="Parameters to adapt besides target_modules, by full name or name suffix (peft's "
        "target_parameters): a mixture-of-experts model's experts are 3-D parameters no module name "
        "reaches, e.g. [mlp.experts.gate_up_proj, mlp.experts.down_proj] for gpt-oss. Each name must "
        "match a parameter of the model. Each expert gets its own rank-r factors; during the update "
        "every adapted parameter is rebuilt in full (W + BA) per layer, which rft plan counts; "
        "lora_dropout must be 0. "
        "Qwen3-MoE (and the other models peft converts from transformers 4's layout) already get "
        "their experts from target_modules: 'all-linear' or gate_proj/up_proj/down_proj. "
        "docs/models.md#mixture-of-experts-models-adapters-and-memory.",
    )
    adapt_vision: Literal["none", "projector", "all"] = Field(
        default="none",
        description="Vision-language models: what LoRA adapts besides the language model. 'none': "
        "the vision tower and its projector stay frozen; 'projector': the projector (Qwen2-VL's "
        "visual.merger) too; 'all': the whole vision tower too. A warm-start adapter (init_adapter) "
        "that adapts vision layers outside this scope keeps them as loaded, frozen. Ignored for "
        "text-only models. Only 'none' with engine: vllm, which applies LoRA to the language model only.",
    )

    @field_validator("target_modules")
    @classmethod
    def _non_empty(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, list) and not value:
            raise ValueError("list at least one module name, or use 'all-linear'")
        return value

    @field_validator("target_parameters")
    @classmethod
    def _named(cls, value: list[str]) -> list[str]:
        if any(not name.strip() or name.startswith(".") or name.endswith(".") for name in value):
            raise ValueError("name each parameter in full or by a dotted suffix, e.g. mlp.experts.down_proj")
        return value

    @model_validator(mode="after")
    def _no_dropout_on_parameters(self) -> LoraConfig:
        if self.target_parameters and self.lora_dropout > 0:
            # peft adds BA to the parameter itself; a dropout of the layer's input cannot be applied.
            raise ValueError(
                "lora.target_parameters cannot be combined with lora.lora_dropout > 0 (peft adapts a "
                "parameter as W + BA, with no input to drop): set lora_dropout: 0"
            )
        return self

    def check_served_by(self, engine: str) -> None:
        """Raise ValueError with :func:`vision_lora_refusal`'s sentence when ``engine`` cannot serve
        this adapter."""
        refusal = vision_lora_refusal(self.adapt_vision, engine)
        if refusal is not None:
            raise ValueError(refusal)

    def rank_with(self, init_adapter: str | Path | None) -> int:
        """The rank of the adapter training starts from: ``init_adapter``'s, else ``r``."""
        return self.as_trained(init_adapter).r

    def as_trained(self, init_adapter: str | Path | None) -> LoraConfig:
        """The adapter a run trains: with ``init_adapter``, the warm start's own settings from its
        adapter_config.json (the learner loads it as saved, so its rank, alpha, dropout and targets win
        over this section's; what the plan must count), else this section."""
        adapter_config = Path(init_adapter) / "adapter_config.json" if init_adapter is not None else None
        if adapter_config is None or not adapter_config.is_file():
            return self
        saved = json.loads(adapter_config.read_text())
        update = {key: saved[key] for key in ("r", "lora_alpha", "lora_dropout") if key in saved}
        # peft saves 'all-linear' expanded to the module names it reached; a regex stays a string.
        if isinstance(saved.get("target_modules"), list) and saved["target_modules"]:
            update["target_modules"] = sorted(saved["target_modules"])
        if isinstance(saved.get("target_parameters"), list):
            update["target_parameters"] = list(saved["target_parameters"])
        return self.model_copy(update=update)
