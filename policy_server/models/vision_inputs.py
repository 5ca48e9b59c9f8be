"""A vision-language model's inputs from token ids and images: what engines and the learner share.

The sampler and the learner must feed the model the same numbers, so both build them here, with the
model's own image processor (``preprocessor_config.json``):

- :meth:`VisionInputs.expand`: the chat template renders one ``<|image_pad|>`` per image; the model
  takes one per merged patch (``grid_t * grid_h * grid_w / merge_size**2``), so each is repeated.
  This is the one thing transformers' ``Qwen2VLProcessor`` adds to the image processor (done on ids
  here: that class also wants a video processor, which needs torchvision);
- :meth:`VisionInputs.pixels`: ``pixel_values`` and ``image_grid_thw`` of a list of images;
- :func:`position_ids`: the M-RoPE positions (time, height, width) of padded rows, from the model's
  own ``get_rope_index`` (Qwen2-VL's and Qwen3-VL's take the same arguments); text tokens after an
  image continue from the image's largest position + 1, so a row's next position is
  ``max(positions) + 1``, not its length.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from policy_server.http.images import ImageInput


def is_vision_model(model_config: Any) -> bool:
    """Whether a transformers config is a vision-language model rftkit serves (an image token + a tower)."""
    return getattr(model_config, "vision_config", None) is not None and (
        getattr(model_config, "image_token_id", None) is not None
    )


def load_model(model_dir: str | Path, **options: Any) -> Any:
    """``model_dir``'s model: ``AutoModelForImageTextToText`` for a VLM, else ``AutoModelForCausalLM``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(str(model_dir))
    cls = AutoModelForImageTextToText if is_vision_model(config) else AutoModelForCausalLM
    return cls.from_pretrained(str(model_dir), **options)


class VisionInputs:
    """The image side of one VLM: its image processor and its image placeholder token."""

    def __init__(self, model_dir: str | Path, model_config: Any) -> None:
        from transformers import AutoImageProcessor

        self.image_processor = AutoImageProcessor.from_pretrained(str(model_dir))
        self.image_token_id = int(model_config.image_token_id)
        self.merge_size = int(getattr(self.image_processor, "merge_size", 1))

    def pixels(self, images: list[ImageInput]) -> dict[str, torch.Tensor]:
        """``pixel_values`` and ``image_grid_thw`` (one row per image, in order) for the model."""
        out = self.image_processor(images=[image.to_pil() for image in images], return_tensors="pt")
        return {
            "pixel_values": out["pixel_values"].to(torch.float32),
            "image_grid_thw": out["image_grid_thw"],
        }

    def tokens_per_image(self, image_grid_thw: torch.Tensor) -> list[int]:
        return [int(grid.prod()) // self.merge_size**2 for grid in image_grid_thw]

    def expand(self, ids: list[int], image_grid_thw: torch.Tensor) -> list[int]:
        """``ids`` with the n-th ``<|image_pad|>`` repeated as many times as image n has merged patches."""
        counts = iter(self.tokens_per_image(image_grid_thw))
        expanded: list[int] = []
        for token in ids:
            if token == self.image_token_id:
                count = next(counts, None)
                if count is None:
                    raise ValueError("the prompt has more image placeholders than the call has images")
                expanded.extend([token] * count)
            else:
                expanded.append(token)
        if next(counts, None) is not None:
            raise ValueError("the call has more images than the prompt has image placeholders")
        return expanded


def position_ids(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, image_grid_thw: torch.Tensor | None
) -> torch.Tensor:
    """[3, B, T] M-RoPE positions of padded rows (0 on padding), from ``model``'s ``get_rope_index``.

    ``model``: the ``...ForConditionalGeneration`` (or a peft wrapper of it). Rows without images get
    the plain 0, 1, 2, ... positions on all three axes.
    """
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    image_token_id = inner.config.image_token_id
    if image_grid_thw is None or not len(image_grid_thw):
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        return positions[None].expand(3, -1, -1).contiguous()
    kinds = (input_ids == image_token_id).to(torch.int32)
    positions, _ = inner.model.get_rope_index(
        input_ids, mm_token_type_ids=kinds, image_grid_thw=image_grid_thw, attention_mask=attention_mask
    )
    return positions
