"""The vision tower of a vision-language checkpoint, sized from its config.json's ``vision_config``
(what the learner and vLLM hold besides the language model; :class:`trainer.scale.memory.ModelShape`
counts the language model alone).

Counted for the ViT layout Qwen3-VL and Qwen 3.5 / 3.6 publish (their ``vision_config`` lists
``deepstack_visual_indexes``, empty for Qwen 3.5): a 3-D patch embedding with bias, learned position
embeddings, ``depth`` pre-norm blocks (LayerNorms with bias, fused qkv and proj, a two-layer MLP, all
with biases), a patch merger (a LayerNorm over the hidden size, then two linear layers from
``hidden x spatial_merge_size^2`` features to ``out_hidden_size``) and one more merger per deepstack
index (its LayerNorm over the merged features). Exact against transformers' models on the meta device
(``tests/trainer/test_memory.py``); a tower of another layout is not counted (0).
"""

from __future__ import annotations

from typing import Any


def vision_tower_parameters(vision: dict[str, Any] | None) -> int:
    """Parameters of the vision tower ``vision`` (a config.json's ``vision_config``) describes, 0 for a
    layout this module does not count."""
    if not vision or "deepstack_visual_indexes" not in vision:
        return 0
    hidden, inner = int(vision["hidden_size"]), int(vision["intermediate_size"])
    patch = int(vision.get("in_channels", 3)) * int(vision.get("temporal_patch_size", 2))
    patch = patch * int(vision["patch_size"]) ** 2 * hidden + hidden
    positions = int(vision.get("num_position_embeddings") or 0) * hidden
    # Two LayerNorms (4h), qkv (3h^2 + 3h), proj (h^2 + h), the MLP (2hi + i + h).
    block = 4 * hidden * hidden + 2 * hidden * inner + 9 * hidden + inner
    merged, out = hidden * int(vision.get("spatial_merge_size", 2)) ** 2, int(vision["out_hidden_size"])
    linear = merged * merged + merged + out * merged + out
    deepstack = len(vision["deepstack_visual_indexes"]) * (2 * merged + linear)
    return patch + positions + int(vision["depth"]) * block + 2 * hidden + linear + deepstack
