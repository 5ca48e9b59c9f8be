"""The Llama family and the dense models that share its ChatML/hermes serving: Llama, Mistral,
Qwen2/2.5 and SmolLM2 (a Llama); its tiny model ships the ``chatml-tools`` template."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from policy_server.models.families.base import Family, TinySizes


class Llama(Family):
    name = "llama"
    model_types = ("llama", "mistral", "qwen2")

    def build_tiny(
        self, out: Path, *, seed: int = 0, corpus: Sequence[str] = (), sizes: TinySizes = TinySizes()
    ) -> Path:
        from policy_server.models.tiny import HEAD_DIM, build_tiny_model

        return build_tiny_model(
            out,
            seed=seed,
            corpus=list(corpus),
            num_heads=max(1, sizes.hidden_size // HEAD_DIM),
            **sizes.builder_kwargs(),
        )


FAMILY = Llama()
