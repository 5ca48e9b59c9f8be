"""``rft sft`` on demonstrations with images, for a vision-language model (Qwen2-VL family).

A demonstration's image parts (``{"type": "image_url", "image_url": {"url": "data:image/png;base64,
..."}}``, as agents send them) are rendered by the chat template as one image placeholder each
(``<|vision_start|><|image_pad|><|vision_end|>``). The image processor turns each image into patches
and a grid (t, h, w); the placeholder is then repeated once per merged patch (``t * h * w /
merge_size**2`` tokens), which is what the model's processor does and what the policy server's
prompt ids hold. Placeholders are context, never loss. The model gets the pixel values, the grids
and ``mm_token_type_ids`` (1 on image tokens), from which it computes its M-RoPE positions itself.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.sft import (
    IGNORE,
    DemonstrationError,
    EncodedDemonstration,
    Trainee,
    encode_demonstration,
    pad_batch,
    pad_token_id,
)

IMAGE_PAD = "<|image_pad|>"


def is_vision_model(model_dir: str | Path) -> bool:
    """Whether ``model_dir`` holds a vision-language model (its config has a ``vision_config``)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return "vision_config" in config


@dataclass(frozen=True)
class EncodedVisionDemonstration:
    """A rendered demonstration with its images: expanded ids, loss mask, pixel values and grids."""

    input_ids: list[int]
    loss_mask: list[bool]
    pixel_values: torch.Tensor  # (patches, channels * temporal * patch * patch), every image's rows
    image_grid_thw: torch.Tensor  # (images, 3)


def demonstration_images(demonstration: dict[str, Any]) -> list[Any]:
    """The PIL images of a demonstration's image parts, in the order the template renders them."""
    from PIL import Image

    images = []
    for message in demonstration.get("messages", []):
        content = message.get("content")
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and part.get("type") == "image_url":
                url = (part.get("image_url") or {}).get("url", "")
                _, _, payload = url.partition(";base64,")
                if not url.startswith("data:") or not payload:
                    raise DemonstrationError("a demonstration's image must be a data:...;base64,... URL")
                with Image.open(io.BytesIO(base64.b64decode(payload))) as image:
                    images.append(image.convert("RGB"))
    return images


def encode_vision_demonstration(
    tokenizer: Any, image_processor: Any, demonstration: dict[str, Any]
) -> EncodedVisionDemonstration:
    """Render, tokenize and expand one demonstration's image placeholders (see the module docstring)."""
    text = encode_demonstration(tokenizer, demonstration)
    pad_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    images = demonstration_images(demonstration)
    placeholders = text.input_ids.count(pad_id)
    if placeholders != len(images):
        raise DemonstrationError(
            f"the chat template rendered {placeholders} image placeholders for {len(images)} images; "
            "use a template that renders image parts (chatml-tools-vision)"
        )
    if not images:
        return EncodedVisionDemonstration(
            text.input_ids, text.loss_mask, torch.zeros(0, 0), torch.zeros(0, 3, dtype=torch.long)
        )
    processed = image_processor(images=images, return_tensors="pt")
    grids = processed["image_grid_thw"]
    merge = int(image_processor.merge_size)
    counts = iter([int(grid.prod()) // (merge * merge) for grid in grids])
    ids: list[int] = []
    mask: list[bool] = []
    for token, loss in zip(text.input_ids, text.loss_mask, strict=True):
        repeat = next(counts) if token == pad_id else 1
        ids.extend([token] * repeat)
        mask.extend([loss and token != pad_id] * repeat)
    return EncodedVisionDemonstration(ids, mask, processed["pixel_values"], grids)


def vision_batch(
    examples: Sequence[EncodedVisionDemonstration], pad_id: int, image_token_id: int
) -> dict[str, torch.Tensor]:
    """Right-padded ids, labels and masks, with every example's images in order."""
    text = [EncodedDemonstration(example.input_ids, example.loss_mask) for example in examples]
    batch = pad_batch(text, pad_id)
    batch["mm_token_type_ids"] = (
        (batch["input_ids"] == image_token_id) & (batch["attention_mask"] == 1)
    ).long()
    with_images = [example for example in examples if example.image_grid_thw.shape[0]]
    if with_images:
        batch["pixel_values"] = torch.cat([example.pixel_values for example in with_images])
        batch["image_grid_thw"] = torch.cat([example.image_grid_thw for example in with_images])
    return batch


def vision_assistant_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy over the batch's assistant tokens, images as inputs."""
    inputs = {name: value for name, value in batch.items() if name != "labels"}
    logits = model(**inputs).logits
    targets = batch["labels"][:, 1:]
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE
    )


def vision_trainee(
    model_dir: str | Path, tokenizer: Any, demonstrations: Sequence[dict[str, Any]]
) -> Trainee:
    """A vision-language model's warm start: its image processor encodes the demonstrations' images."""
    from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageTextToText

    image_processor = AutoImageProcessor.from_pretrained(str(model_dir))
    encoded = [encode_vision_demonstration(tokenizer, image_processor, demo) for demo in demonstrations]
    config = AutoConfig.from_pretrained(str(model_dir))
    pad_id, image_token_id = pad_token_id(config), int(config.image_token_id)
    return Trainee(
        encoded=encoded,
        load_model=lambda: AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32),
        batch=lambda examples: vision_batch(examples, pad_id, image_token_id),
        loss=vision_assistant_loss,
    )
