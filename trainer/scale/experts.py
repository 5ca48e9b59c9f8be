"""Stacked parameters LoRA adapts (mixture-of-experts' expert stacks), for :mod:`trainer.scale.memory`."""

from __future__ import annotations

from dataclasses import dataclass

# Model types whose experts peft (0.21, on transformers 5) adapts from target_modules, as it did when
# they were nn.Linear modules in transformers 4: the fused gate_up stack at twice the rank, the
# down stack, and the router's weight under 'all-linear'.
PEFT_CONVERTED_EXPERTS = ("qwen3_moe",)


@dataclass(frozen=True)
class AdaptedStack:
    """A stacked parameter LoRA adapts as peft's ``target_parameters`` do (an expert stack, or a
    router's weight): each of its ``experts`` matrices of (in, out) features gets rank-``rank`` factors."""

    name: str
    features_in: int
    features_out: int
    rank: int
    experts: int

    @property
    def lora_parameters(self) -> int:
        return self.rank * self.experts * (self.features_in + self.features_out)

    @property
    def weights(self) -> int:
        """The stack's size: what peft rebuilds (W + BA) on each forward while it is adapted."""
        return self.experts * self.features_in * self.features_out
