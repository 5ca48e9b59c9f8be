"""Qwen3-VL (Qwen3-VL-2B to 235B, Instruct and Thinking; the MoE ones too): the model of SkyRL's
visual maze. ChatML with hermes ``<tool_call>`` JSON blocks and Qwen2-VL's vision tokens, under Qwen's
own tools preamble (the ``qwen3-vl`` template, which the tiny model ships); vLLM's ``hermes`` parser.

The Thinking models' template opens ``<think>`` in the generation prompt, so their completions are
reasoning up to ``</think>``; the Instruct models' never think. Both share one ``model_type``, so the
family sets no reasoning parser and a Thinking model is served with ``vllm.reasoning_parser: qwen3``
(docs/models.md). DeepStack mergers project three tower blocks into the language model beside the
main merger: LoRA's ``adapt_vision: projector`` adapts them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from policy_server.models.families.base import Family, TinySizes, VisionParts


class Qwen3VL(Family):
    name = "qwen3_vl"
    model_types = ("qwen3_vl", "qwen3_vl_moe")
    vision = True
    vision_parts = VisionParts(projectors=("model.visual.merger.", "model.visual.deepstack_merger_list."))

    def build_tiny(
        self, out: Path, *, seed: int = 0, corpus: Sequence[str] = (), sizes: TinySizes = TinySizes()
    ) -> Path:
        from policy_server.models.tiny_qwen3_vl import build_tiny_qwen3_vl

        return build_tiny_qwen3_vl(
            out,
            seed=seed,
            corpus=list(corpus),
            **sizes.builder_kwargs(intermediate=False),
        )


FAMILY = Qwen3VL()
