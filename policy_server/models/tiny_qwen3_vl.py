"""A tiny offline Qwen3-VL (the architecture of SkyRL's visual-maze model), random init, for tests.

``rft model tiny DIR --family qwen3_vl`` writes a directory that transformers
(``AutoModelForImageTextToText``), peft and vLLM load:

- the language model is Qwen3-VL's (q/k norms, interleaved M-RoPE) at the tiny model's size: 2
  layers, head_dim 64, M-RoPE sections (12, 10, 10) summing to head_dim / 2 in Qwen3-VL's 24:20:20
  proportions;
- the vision tower is 2 blocks of width 64 over 8-pixel patches with learned position embeddings
  (a 16x16 grid, interpolated to each image's), merged 2x2; one DeepStack merger takes the first
  block's output into the first language layer, as Qwen3-VL's three take three of its blocks'. A
  64x64 image is 8x8 patches and reaches the language model as 16 ``<|image_pad|>`` tokens;
- the tokenizer is the tiny model's BPE, trained on conversations in Qwen3-VL's format, with
  Qwen3-VL's vision special tokens (Qwen2-VL's four) and ``<think>``/``</think>`` as added tokens;
  it carries the ``qwen3-vl`` template;
- the image processor is Qwen3-VL's (Qwen2-VL's class, mean and std 0.5) resizing images to
  between 32x32 and 128x128 pixels (multiples of 16), so an image costs 4 to 64 prompt tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from policy_server.models.chat_templates import chat_template_text
from policy_server.models.saving import plain_tokenizer_class, save_random_model
from policy_server.models.tiny import (
    _PROSE,
    END_OF_TEXT,
    HEAD_DIM,
    IM_END,
    _example_conversations,
    _save_tokenizer,
    _train_tokenizer,
)
from policy_server.models.tiny_vision import (
    IMAGE_PAD,
    MAX_PIXELS,
    MERGE_SIZE,
    MIN_PIXELS,
    PATCH_SIZE,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
    VISION_TOKENS,
)

CHAT_TEMPLATE = chat_template_text("qwen3-vl")
THINK_TAGS = ("<think>", "</think>")
# Qwen3-VL's M-RoPE: (time, height, width) frequencies 24:20:20 of head_dim 128, interleaved.
MROPE_SECTION = (12, 10, 10)
ROPE_THETA = 5_000_000.0
TOWER_DEPTH, TOWER_WIDTH, TOWER_HEADS = 2, 64, 2
# Blocks whose output a DeepStack merger adds to the language model's first hidden states, in order.
DEEPSTACK_BLOCKS = (0,)
POSITION_GRID = (128 // PATCH_SIZE) ** 2  # learned position embeddings: the largest image's patches


def _corpus_texts(extra: Iterable[str] | None) -> list[str]:
    """The tiny model's conversations rendered in Qwen3-VL's format, its prose and ``extra``."""
    from transformers.utils.chat_template_utils import render_jinja_template

    texts: list[str] = []
    for messages, tools in _example_conversations():
        rendered, _ = render_jinja_template(
            conversations=[messages], tools=tools or None, chat_template=CHAT_TEMPLATE
        )
        texts.extend(rendered)
    texts.extend(_PROSE)
    texts.extend(extra or ())
    return texts


def _save_tokenizer_and_processor(
    out: Path, corpus: Iterable[str] | None, vocab_size: int, max_length: int
) -> Any:
    from tokenizers import AddedToken
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = _save_tokenizer(
        _train_tokenizer(_corpus_texts(corpus), vocab_size),
        out,
        max_length,
        chat_template=CHAT_TEMPLATE,
        extra_special_tokens=VISION_TOKENS,
    )
    # Qwen3-VL's <think> tags are added tokens but not special ones: decoding keeps them as text.
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in THINK_TAGS])
    tokenizer.save_pretrained(out)
    processor = Qwen2VLImageProcessorPil(
        patch_size=PATCH_SIZE,
        merge_size=MERGE_SIZE,
        temporal_patch_size=2,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
    )
    processor.save_pretrained(out)
    # As tiny_vision.py: the plain class names load in vLLM's transformers and without torchvision.
    path = out / "preprocessor_config.json"
    path.write_text(path.read_text().replace("Qwen2VLImageProcessorPil", "Qwen2VLImageProcessor"))
    plain_tokenizer_class(out)
    return tokenizer


def _config(tokenizer: Any, hidden_size: int, num_layers: int, max_positions: int) -> Any:
    from transformers import Qwen3VLConfig

    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in (*VISION_TOKENS, IM_END, END_OF_TEXT)}
    text_config = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": hidden_size // HEAD_DIM,
        "num_key_value_heads": hidden_size // HEAD_DIM,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": max_positions,
        # vLLM reads mrope_interleaved; transformers' Qwen3-VL always interleaves.
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": ROPE_THETA,
            "mrope_section": list(MROPE_SECTION),
            "mrope_interleaved": True,
        },
        "eos_token_id": ids[IM_END],
        "pad_token_id": ids[END_OF_TEXT],
        "bos_token_id": None,
        "tie_word_embeddings": False,
    }
    vision_config = {
        "depth": TOWER_DEPTH,
        "hidden_size": TOWER_WIDTH,
        "intermediate_size": 2 * TOWER_WIDTH,
        "num_heads": TOWER_HEADS,
        "out_hidden_size": hidden_size,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": 2,
        "num_position_embeddings": POSITION_GRID,
        "deepstack_visual_indexes": list(DEEPSTACK_BLOCKS),
    }
    return Qwen3VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=False,
        dtype="float32",
    )


def build_tiny_qwen3_vl(
    out_dir: str | Path,
    *,
    seed: int = 0,
    corpus: Iterable[str] | None = None,
    vocab_size: int = 1024,
    hidden_size: int = 128,
    num_layers: int = 2,
    max_position_embeddings: int = 2048,
) -> Path:
    """Build the tokenizer, image processor and a randomly initialised Qwen3-VL into ``out_dir``.

    ``corpus`` and ``vocab_size`` are the tiny model's (``build_tiny_model``); ``hidden_size`` must be
    a multiple of 64 (head_dim 64, vLLM's) and ``num_layers`` at least the DeepStack mergers' count.
    """
    from transformers import Qwen3VLForConditionalGeneration

    if hidden_size % HEAD_DIM:
        raise ValueError(f"hidden_size ({hidden_size}) must be a multiple of {HEAD_DIM} (vLLM's head_dim)")
    if num_layers < len(DEEPSTACK_BLOCKS):
        raise ValueError(
            f"num_layers ({num_layers}) must be at least {len(DEEPSTACK_BLOCKS)}: each DeepStack "
            "merger feeds one language layer"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _save_tokenizer_and_processor(out, corpus, vocab_size, max_position_embeddings)
    config = _config(tokenizer, hidden_size, num_layers, max_position_embeddings)
    im_end, end_of_text = config.text_config.eos_token_id, config.text_config.pad_token_id
    return save_random_model(
        Qwen3VLForConditionalGeneration,
        config,
        out,
        seed=seed,
        eos_token_ids=[im_end, end_of_text],
        pad_token_id=end_of_text,
    )
