"""The learner's side of vision-language models: which layers LoRA adapts, and the model inputs of a
micro-batch whose sequences carry images.

LoRA adapts the language model by default; the vision tower and its projectors (Qwen2-VL's
``visual.merger``; Qwen3-VL's and its DeepStack mergers) stay frozen, as they were pretrained.
``lora.adapt_vision`` widens that to the projectors (``projector``) or to the whole tower (``all``);
where each part lives in the model is its family's (``Family.vision_parts``). A warm-start adapter
(``init_adapter``) may adapt the tower too (``rft sft`` on pictures does): its vision layers outside
that scope load as they are and stay frozen, so RL moves what the policy does with what it sees, not
how it sees.

A micro-batch's images are read back from the run's image store by hash (``TrainingSequence.images``)
and go through the model's own image processor (:class:`policy_server.models.vision_inputs.VisionInputs`,
the hf engine's), so the learner feeds the model the pixels, grid sizes and M-RoPE positions the
sampler fed it, and its token logprobs equal the sampler's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from policy_server.models import VisionInputs, position_ids
from policy_server.models.families import HERMES, VisionParts, family_for_model_type

if TYPE_CHECKING:
    from policy_server import ImageStore
    from trainer.algo.sequences import SequenceBatch, TrainingSequence
    from trainer.config import LoraConfig

_PEFT_PREFIX = "base_model.model."  # what peft puts before a wrapped model's parameter names


def vision_parts(model: Any) -> VisionParts:
    """Where ``model``'s (or its peft wrapper's) language model, tower and projectors live."""
    return (family_for_model_type(model.config.model_type) or HERMES).vision_parts


def _vision_scope(parts: VisionParts, adapt_vision: str) -> tuple[str, ...]:
    """The vision prefixes ``lora.adapt_vision`` lets LoRA train."""
    return {"none": (), "projector": parts.projectors, "all": (parts.tower,)}[adapt_vision]


def lora_targets(model: Any, lora: LoraConfig) -> list[str]:
    """Full names of the linear layers LoRA adapts in a VLM: the language model's, plus the
    projectors' or the whole vision tower's as ``lora.adapt_vision`` says; ``lora.target_modules``
    (a list of names) narrows each part to layers whose name ends with one of them."""
    parts = vision_parts(model)
    scopes = [parts.language_model, *_vision_scope(parts, lora.adapt_vision)]
    wanted = None if lora.target_modules == "all-linear" else set(lora.target_modules)
    names = [
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
        and name.startswith(tuple(scopes))
        and (wanted is None or name.rsplit(".", 1)[-1] in wanted)
    ]
    if not names:
        raise ValueError(
            f"lora.target_modules {lora.target_modules!r} names no linear layer of this model's "
            f"language model{' or vision layers' if lora.adapt_vision != 'none' else ''}"
        )
    return names


def freeze_vision_outside_scope(model: Any, lora: LoraConfig) -> int:
    """Freeze the trainable (LoRA) parameters of ``model``'s vision tower that ``lora.adapt_vision``
    leaves out, as a warm-start adapter loads every layer it adapts trainable; returns how many."""
    parts = vision_parts(model)
    kept = _vision_scope(parts, lora.adapt_vision)
    frozen = 0
    for name, param in model.named_parameters():
        inner = name.removeprefix(_PEFT_PREFIX)
        if param.requires_grad and inner.startswith(parts.tower) and not inner.startswith(kept):
            param.requires_grad_(False)
            frozen += 1
    return frozen


def batch_vision_inputs(
    model: Any,
    vision: VisionInputs,
    store: ImageStore | None,
    micro: Sequence[TrainingSequence],
    batch: SequenceBatch,
    device: torch.device,
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """``position_ids`` (M-RoPE, [3, B, T]) and, with images, ``pixel_values`` and ``image_grid_thw``."""
    refs = [ref for sequence in micro for ref in sequence.images]
    grid = None
    inputs: dict[str, torch.Tensor] = {}
    if refs:
        if store is None:
            raise ValueError("these sequences carry images, but the learner was given no image store")
        pixels = vision.pixels([store.image(ref.sha256) for ref in refs])
        counts = vision.tokens_per_image(pixels["image_grid_thw"])
        for ref, count in zip(refs, counts, strict=True):
            if ref.length != count:
                raise ValueError(
                    f"image {ref.sha256[:12]} took {ref.length} prompt tokens when sampled but the "
                    f"processor gives it {count}: the sampler used another image processor"
                )
        grid = pixels["image_grid_thw"]
        inputs = {
            "pixel_values": pixels["pixel_values"].to(device=device, dtype=dtype),
            "image_grid_thw": grid.to(device),
        }
    positions = position_ids(model, batch.input_ids.cpu(), batch.attention_mask.cpu(), grid)
    inputs["position_ids"] = positions.to(device)
    return inputs


def stray_placeholders(sequence: TrainingSequence, image_token_id: int) -> bool:
    """Whether ``sequence`` holds an image placeholder token outside its images' runs: one the policy
    sampled. The model would take it for an image at training time (it places image features on every
    placeholder), so such a sequence cannot be scored as it was sampled and stays out of the update."""
    inside = {position for ref in sequence.images for position in range(ref.start, ref.start + ref.length)}
    return any(
        token == image_token_id and index not in inside for index, token in enumerate(sequence.token_ids)
    )
