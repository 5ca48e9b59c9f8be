"""Qwen2-VL: the tiny vision-language model of the visual maze, hermes tool calls in ChatML with
vision tokens; its tiny model ships the ``chatml-tools-vision`` template."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from policy_server.models.families.base import Family, TinySizes


class Qwen2VL(Family):
    name = "qwen2_vl"
    model_types = ("qwen2_vl",)
    vision = True

    def build_tiny(
        self, out: Path, *, seed: int = 0, corpus: Sequence[str] = (), sizes: TinySizes = TinySizes()
    ) -> Path:
        from policy_server.models.tiny_vision import build_tiny_vision_model

        return build_tiny_vision_model(
            out,
            seed=seed,
            corpus=list(corpus),
            vocab_size=sizes.vocab_size,
            hidden_size=sizes.hidden_size,
            num_layers=sizes.num_layers,
            max_position_embeddings=sizes.max_position_embeddings,
        )


FAMILY = Qwen2VL()
