"""``rft sft`` with images: the maze's picture demonstrations warm-start the tiny VLM. Each image's
placeholder becomes one token per merged patch (context, no loss), the model sees the pixels, and
the adapter may cover the vision tower and projector besides the language model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from agents.maze.demonstrations import maze_demonstrations
from policy_server.models.chat_templates import load_tokenizer
from policy_server.models.vision_inputs import VisionInputs
from trainer.sft.common import DemonstrationError
from trainer.sft.text import run_sft
from trainer.sft.turns import encode_demonstration
from trainer.sft.vision import encode_vision_demonstration

# Every language-model projection, the embeddings and the output layer, and the vision side: the
# tower's attention and MLP and the patch merger (the projector into the language model).
VISION_TARGETS = ["embed_tokens", "q_proj", "v_proj", "lm_head", "qkv", "fc1", "mlp.0", "mlp.2"]


def test_placeholders_expand_per_patch_and_carry_no_loss(tiny_vision_dir: Path) -> None:
    tokenizer = load_tokenizer(tiny_vision_dir, None)
    vision = VisionInputs(tiny_vision_dir, AutoConfig.from_pretrained(tiny_vision_dir))
    demonstration = maze_demonstrations(1, observation="image")[1]  # a move result: one picture
    (encoded,) = encode_vision_demonstration(tokenizer, vision, demonstration)
    (text,) = encode_demonstration(tokenizer, demonstration)
    image_token = vision.image_token_id
    # The 4x4 map is 64x64 pixels, 8x8 patches of 8 pixels, merged 2x2: 16 image tokens, one a cell.
    assert encoded.image_grid_thw.tolist() == [[1, 8, 8]]
    assert encoded.input_ids.count(image_token) == 16 and text.input_ids.count(image_token) == 1
    assert not any(m for t, m in zip(encoded.input_ids, encoded.loss_mask, strict=True) if t == image_token)
    # Everything else is the text encoding, loss mask included.
    kept = [(t, m) for t, m in zip(encoded.input_ids, encoded.loss_mask, strict=True) if t != image_token]
    assert kept == [(t, m) for t, m in zip(text.input_ids, text.loss_mask, strict=True) if t != image_token]
    assert encoded.pixel_values.shape[0] == 64


def test_a_remote_image_is_refused_as_the_gateway_refuses_it(tiny_vision_dir: Path) -> None:
    tokenizer = load_tokenizer(tiny_vision_dir, None)
    vision = VisionInputs(tiny_vision_dir, AutoConfig.from_pretrained(tiny_vision_dir))
    demonstration = maze_demonstrations(1, observation="image")[0]
    demonstration["messages"][1]["content"][1]["image_url"]["url"] = "http://example.com/maze.png"
    with pytest.raises(DemonstrationError, match="fetches nothing"):
        encode_vision_demonstration(tokenizer, vision, demonstration)


def test_vision_sft_lowers_the_loss_and_adapts_the_tower(tiny_vision_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel

    from policy_server.models.vision_inputs import load_model

    result = run_sft(
        tiny_vision_dir,
        maze_demonstrations(4, observation="image"),
        tmp_path / "adapter",
        steps=10,
        batch_size=2,
        learning_rate=5e-3,
        target_modules=VISION_TARGETS,
        seed=0,
    )
    assert sum(result.losses[-3:]) / 3 < 0.75 * result.losses[0], result.losses
    config = json.loads((result.adapter_dir / "adapter_config.json").read_text())
    assert set(config["target_modules"]) == set(VISION_TARGETS)
    model = PeftModel.from_pretrained(load_model(tiny_vision_dir, dtype=torch.float32), result.adapter_dir)
    trained = {name for name, p in model.named_parameters() if "lora_B" in name and torch.count_nonzero(p)}
    assert any(".visual.blocks." in name for name in trained) and any(".merger." in name for name in trained)
    assert any(".language_model." in name for name in trained)
