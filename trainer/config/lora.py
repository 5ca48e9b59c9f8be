"""The LoRA adapter section."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import (
    Field,
    field_validator,
)

from trainer.config.common import _Section


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
    adapt_vision: Literal["none", "projector", "all"] = Field(
        default="none",
        description="Vision-language models: what LoRA adapts besides the language model. 'none': "
        "the vision tower and its projector stay frozen; 'projector': the projector (Qwen2-VL's "
        "visual.merger) too; 'all': the whole vision tower too. A warm-start adapter (init_adapter) "
        "that adapts vision layers outside this scope keeps them as loaded, frozen. Ignored for "
        "text-only models.",
    )

    @field_validator("target_modules")
    @classmethod
    def _non_empty(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, list) and not value:
            raise ValueError("list at least one module name, or use 'all-linear'")
        return value

    def rank_with(self, init_adapter: str | Path | None) -> int:
        """The rank of the adapter training starts from: ``init_adapter``'s, else ``r``."""
        if init_adapter is not None:
            adapter_config = Path(init_adapter) / "adapter_config.json"
            if adapter_config.is_file():
                return int(json.loads(adapter_config.read_text())["r"])
        return self.r
