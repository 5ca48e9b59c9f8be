"""``rft sft`` on demonstrations with images, for a vision-language model (Qwen2-VL, Qwen3-VL).

A demonstration's image parts (``{"type": "image_url", "image_url": {"url": "data:image/png;base64,
..."}}``, as agents send them) are decoded and checked as the gateway does (``policy_server.http.images``)
and rendered by the chat template as one placeholder each. ``policy_server.models.vision_inputs`` then does
what the engines do: the image processor turns each image into patches and a grid, and the
placeholder is repeated once per merged patch, so the warm start sees the prompt ids the policy
server records. Placeholders are context, never loss. The model gets the pixel values, the grids and
``mm_token_type_ids`` (1 on image tokens), from which it computes its M-RoPE positions itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from policy_server import ImageError, ImageInput, ImageLimits, image_from_url, image_parts
from policy_server.models import VisionInputs
from trainer.learner.base_load import load_for_training
from trainer.sft.common import (
    DemonstrationError,
    EncodedDemonstration,
    Trainee,
    demonstration_batch,
    encode_each,
    pad_token_id,
)
from trainer.sft.turns import encode_demonstration


@dataclass(frozen=True)
class EncodedVisionDemonstration:
    """A rendered demonstration with its images: expanded ids, loss mask, pixel values and grids."""

    input_ids: list[int]
    loss_mask: list[bool]
    pixel_values: torch.Tensor  # every image's patch rows, in order
    image_grid_thw: torch.Tensor  # (images, 3)


def demonstration_images(demonstration: dict[str, Any]) -> list[ImageInput]:
    """The demonstration's images, decoded and checked as the gateway does, in prompt order."""
    try:
        return [
            image_from_url(url, ImageLimits(), where) for where, url in image_parts(demonstration["messages"])
        ]
    except ImageError as error:
        raise DemonstrationError(str(error)) from error


def encode_vision_demonstration(
    tokenizer: Any, vision: VisionInputs, demonstration: dict[str, Any]
) -> list[EncodedVisionDemonstration]:
    """Each training sequence of one demonstration (``trainer.sft.turns``) with its images'
    placeholders expanded. A sequence starts where the conversation starts, so its images are the
    demonstration's first ones, as many as it holds placeholders."""
    images = demonstration_images(demonstration)
    sequences = encode_demonstration(tokenizer, demonstration)
    placeholders = max(text.input_ids.count(vision.image_token_id) for text in sequences)
    if placeholders != len(images):
        raise DemonstrationError(
            f"the chat template rendered {placeholders} image placeholders for {len(images)} images; "
            "use a template that renders image parts (chatml-tools-vision, qwen3-vl)"
        )
    return [_expanded(vision, text, images) for text in sequences]


def _expanded(
    vision: VisionInputs, text: EncodedDemonstration, images: list[ImageInput]
) -> EncodedVisionDemonstration:
    """``text`` with each of its image placeholders repeated once per merged patch of its image."""
    images = images[: text.input_ids.count(vision.image_token_id)]
    if not images:
        return EncodedVisionDemonstration(
            text.input_ids, text.loss_mask, torch.zeros(0, 0), torch.zeros(0, 3, dtype=torch.long)
        )
    pixels = vision.pixels(images)
    counts = iter(vision.tokens_per_image(pixels["image_grid_thw"]))
    ids: list[int] = []
    mask: list[bool] = []
    for token, loss in zip(text.input_ids, text.loss_mask, strict=True):
        placeholder = token == vision.image_token_id
        repeat = next(counts) if placeholder else 1
        ids.extend([token] * repeat)
        mask.extend([loss and not placeholder] * repeat)
    return EncodedVisionDemonstration(ids, mask, pixels["pixel_values"], pixels["image_grid_thw"])


def vision_batch(
    examples: Sequence[EncodedVisionDemonstration], pad_id: int, image_token_id: int
) -> dict[str, torch.Tensor]:
    """Right-padded ids, labels and masks, with every example's images in order."""
    text = [EncodedDemonstration(example.input_ids, example.loss_mask) for example in examples]
    batch = demonstration_batch(text, pad_id)
    batch["mm_token_type_ids"] = (
        (batch["input_ids"] == image_token_id) & (batch["attention_mask"] == 1)
    ).long()
    with_images = [example for example in examples if example.image_grid_thw.shape[0]]
    if with_images:
        batch["pixel_values"] = torch.cat([example.pixel_values for example in with_images])
        batch["image_grid_thw"] = torch.cat([example.image_grid_thw for example in with_images])
    return batch


def vision_logits(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """A vision-language model's logits for a demonstration batch, images as inputs."""
    return model(**{name: value for name, value in batch.items() if name != "labels"}).logits


def vision_trainee(
    model_dir: str | Path, tokenizer: Any, demonstrations: Sequence[dict[str, Any]]
) -> Trainee:
    """A vision-language model's warm start: its image processor encodes the demonstrations' images."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_dir))
    vision = VisionInputs(model_dir, config)
    encoded = encode_each(demonstrations, lambda demo: encode_vision_demonstration(tokenizer, vision, demo))
    pad_id = pad_token_id(config)
    return Trainee(
        encoded=encoded,
        load_model=lambda dtype: load_for_training(model_dir, dtype)[0],
        batch=lambda examples: vision_batch(examples, pad_id, vision.image_token_id),
        forward=vision_logits,
    )
