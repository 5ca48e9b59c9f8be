"""A tiny offline vision-language model: Qwen2-VL at toy size, random init, for tests and CPU demos.

``rft model tiny-vision OUT`` writes a directory that transformers
(``AutoModelForImageTextToText`` + ``AutoProcessor``), peft and vLLM load:

- the text side is the tiny model's (``tiny_model.py``: the same BPE training, 2 layers, head_dim 64)
  in Qwen2-VL's language model, with M-RoPE sections summing to head_dim / 2;
- the vision tower is 2 blocks of width 64 over 8-pixel patches, merged 2x2: a 64x64 image is 8x8
  patches and reaches the language model as 16 ``<|image_pad|>`` tokens;
- the tokenizer adds Qwen2-VL's vision special tokens and carries the ``chatml-tools-vision``
  template (tools, tool calls, image parts in user messages and tool results);
- the image processor resizes images to between 32x32 and 128x128 pixels (multiples of 16), so an
  image costs 4 to 64 prompt tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policy_server.models.chat_templates import chat_template_text
from policy_server.models.saving import plain_tokenizer_class, save_random_model
from policy_server.models.tiny import (
    END_OF_TEXT,
    HEAD_DIM,
    IM_END,
    _corpus_texts,
    _save_tokenizer,
    _train_tokenizer,
)

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)

CHAT_TEMPLATE = chat_template_text("chatml-tools-vision")

PATCH_SIZE = 8
MERGE_SIZE = 2
MIN_PIXELS = 32 * 32
MAX_PIXELS = 128 * 128


def _image_processor() -> Any:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        patch_size=PATCH_SIZE,
        merge_size=MERGE_SIZE,
        temporal_patch_size=2,
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
    )


def _save_processor(out: Path) -> None:
    """Save the image processor (``preprocessor_config.json``).

    Only the image processor: transformers' ``Qwen2VLProcessor`` also wants a video processor, which
    needs torchvision; ``policy_server/models/vision_inputs.py`` does the processor's one other job
    (expanding each ``<|image_pad|>`` to the image's patch tokens) on token ids.
    """
    _image_processor().save_pretrained(out)
    # The PIL class name is transformers 5's alone; the plain name loads everywhere (vLLM's
    # transformers, and a torchvision-less install falls back to the PIL class by itself).
    path = out / "preprocessor_config.json"
    path.write_text(path.read_text().replace("Qwen2VLImageProcessorPil", "Qwen2VLImageProcessor"))
    plain_tokenizer_class(out)


@dataclass(frozen=True)
class VisionTower:
    """The tiny VLM's vision tower: blocks, width and attention heads (the width a multiple of the heads,
    whose dimension a multiple of 4 for the 2D rotary embedding)."""

    depth: int = 2
    width: int = 64
    heads: int = 2


@dataclass(frozen=True)
class MRope:
    """The language model's M-RoPE: its base and how many rotary frequencies go to the time, height and
    width of image positions (summing to head_dim / 2), taken in that order from the fastest. Text
    tokens carry one position in all three, so only image tokens feel the split. The default is
    Qwen2-VL's shape: height and width get the slowest frequencies, which over a few rows of patches
    barely turn (docs/demo.md, the visual maze)."""

    theta: float = 10000.0
    sections: tuple[int, int, int] = (HEAD_DIM // 4, HEAD_DIM // 8, HEAD_DIM // 8)


def _config(
    tokenizer: Any, hidden_size: int, num_layers: int, max_positions: int, tower: VisionTower, rope: MRope
) -> Any:
    from transformers import Qwen2VLConfig

    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in (*VISION_TOKENS, IM_END, END_OF_TEXT)}
    text_config = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": hidden_size // HEAD_DIM,
        "num_key_value_heads": hidden_size // HEAD_DIM,
        "max_position_embeddings": max_positions,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": rope.theta,
            "mrope_section": list(rope.sections),
        },
        "eos_token_id": ids[IM_END],
        "pad_token_id": ids[END_OF_TEXT],
        "bos_token_id": None,
        "tie_word_embeddings": False,
    }
    vision_config = {
        "depth": tower.depth,
        "embed_dim": tower.width,
        "hidden_size": hidden_size,
        "num_heads": tower.heads,
        "mlp_ratio": 2,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": 2,
    }
    return Qwen2VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=False,
        dtype="float32",
    )


def build_tiny_vision_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    corpus: Iterable[str] | None = None,
    vocab_size: int = 1024,
    hidden_size: int = 128,
    num_layers: int = 2,
    max_position_embeddings: int = 2048,
    tower: VisionTower | None = None,
    rope: MRope | None = None,
) -> Path:
    """Build the tokenizer, processor and a randomly initialised Qwen2-VL into ``out_dir``; return it.

    ``corpus`` and ``vocab_size`` are the text tiny model's (``build_tiny_model``); ``hidden_size``
    must be a multiple of 64 (vLLM's head_dim); ``tower`` sizes the vision tower (default: 2 blocks of
    width 64, 2 heads); ``rope`` the language model's M-RoPE (default: Qwen2-VL's shape).
    """
    from transformers import Qwen2VLForConditionalGeneration

    if hidden_size % HEAD_DIM:
        raise ValueError(f"hidden_size ({hidden_size}) must be a multiple of {HEAD_DIM} (vLLM's head_dim)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _save_tokenizer(
        _train_tokenizer(_corpus_texts(corpus), vocab_size),
        out,
        max_position_embeddings,
        chat_template=CHAT_TEMPLATE,
        extra_special_tokens=VISION_TOKENS,
    )
    _save_processor(out)
    tower = tower or VisionTower()
    if tower.width % tower.heads or (tower.width // tower.heads) % 4:
        raise ValueError(
            f"the vision tower's width ({tower.width}) must split into {tower.heads} heads of a multiple of 4"
        )
    rope = rope or MRope()
    if sum(rope.sections) != HEAD_DIM // 2:
        raise ValueError(f"M-RoPE sections {rope.sections} must sum to {HEAD_DIM // 2} (head_dim / 2)")
    config = _config(tokenizer, hidden_size, num_layers, max_position_embeddings, tower, rope)
    im_end, end_of_text = config.text_config.eos_token_id, config.text_config.pad_token_id
    return save_random_model(
        Qwen2VLForConditionalGeneration,
        config,
        out,
        seed=seed,
        eos_token_ids=[im_end, end_of_text],
        pad_token_id=end_of_text,
    )
