"""``rft model tiny-vision``: a Qwen2-VL at toy size that transformers and peft load and run with images."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoImageProcessor, AutoTokenizer

from policy_server.http.images import ImageLimits, image_from_bytes
from policy_server.models.model_cli import main as model_main
from policy_server.models.tiny_vision import IMAGE_PAD, VISION_END, VISION_START
from policy_server.models.vision_inputs import VisionInputs, is_vision_model, load_model, position_ids
from tests.vision_helpers import image_bytes, image_part

MOVE = {
    "type": "function",
    "function": {"name": "move", "parameters": {"type": "object", "properties": {"d": {"type": "string"}}}},
}


def _conversation() -> list[dict]:
    return [
        {"role": "user", "content": [{"type": "text", "text": "Where is the goal?"}, image_part()]},
        {
            "role": "assistant",
            "tool_calls": [{"type": "function", "function": {"name": "move", "arguments": {"d": "up"}}}],
        },
        {
            "role": "tool",
            "content": [{"type": "text", "text": "moved"}, image_part(image_bytes((0, 0, 200)))],
        },
    ]


def test_template_renders_image_parts_in_user_messages_and_tool_results(tiny_vision_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_vision_dir)
    text = tokenizer.apply_chat_template(
        _conversation(), tools=[MOVE], tokenize=False, add_generation_prompt=True
    )
    block = f"{VISION_START}{IMAGE_PAD}{VISION_END}"
    assert text.count(block) == 2
    assert f"Where is the goal?\n{block}<|im_end|>" in text
    assert f"<tool_response>\nmoved\n{block}\n</tool_response>" in text
    assert '"name": "move"' in text  # the tools section
    ids = tokenizer.apply_chat_template(
        _conversation(), tools=[MOVE], add_generation_prompt=True, return_dict=False
    )
    pad = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    assert ids.count(pad) == 2  # special: one token each, whatever the BPE learnt
    assert tokenizer.decode([pad], skip_special_tokens=True) == ""


def test_cli_builds_a_model_that_runs_an_image_and_takes_lora(tmp_path: Path) -> None:
    assert model_main(["tiny-vision", str(tmp_path / "m"), "--seed", "3"]) == 0
    model = load_model(tmp_path / "m", dtype=torch.float32)
    assert is_vision_model(model.config) and type(model).__name__ == "Qwen2VLForConditionalGeneration"
    assert AutoImageProcessor.from_pretrained(tmp_path / "m").patch_size == 8
    vision = VisionInputs(tmp_path / "m", model.config)
    image = image_from_bytes(image_bytes(), ImageLimits())
    pixels = vision.pixels([image])
    assert pixels["image_grid_thw"].tolist() == [[1, 8, 8]]  # 64x64 in 8-pixel patches
    assert vision.tokens_per_image(pixels["image_grid_thw"]) == [16]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "m")
    ids = tokenizer.apply_chat_template(_conversation()[:1], add_generation_prompt=True, return_dict=False)
    ids = torch.tensor([vision.expand(ids, pixels["image_grid_thw"])])
    mask = torch.ones_like(ids)
    positions = position_ids(model, ids, mask, pixels["image_grid_thw"])
    assert positions.shape == (3, 1, ids.shape[1]) and int(positions.max()) < ids.shape[1] - 1
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, **pixels).logits
    assert torch.isfinite(logits).all()
    # A different image changes the logits after it: the pixels reach the language model.
    other = vision.pixels([image_from_bytes(image_bytes((0, 200, 0)), ImageLimits())])
    other_logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, **other).logits
    assert not torch.allclose(logits[0, -1], other_logits[0, -1])
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    trainable = [name for name, param in lora.named_parameters() if param.requires_grad]
    assert trainable and all("language_model" in name for name in trainable)


def test_the_tower_and_m_rope_are_sized_as_asked(tmp_path: Path) -> None:
    from transformers import AutoConfig

    from policy_server.models import MRope, VisionTower, build_tiny_vision_model

    corpus = ["a maze, a move, a picture"] * 20
    out = build_tiny_vision_model(
        tmp_path / "m", corpus=corpus, tower=VisionTower(3, 128, 4), rope=MRope(10.0, (2, 15, 15))
    )
    config = AutoConfig.from_pretrained(out)
    vision, text = config.vision_config, config.text_config
    assert (vision.depth, vision.embed_dim, vision.num_heads) == (3, 128, 4)
    assert text.rope_parameters["rope_theta"] == 10.0
    assert text.rope_parameters["mrope_section"] == [2, 15, 15]
    with pytest.raises(ValueError, match="must sum to 32"):
        build_tiny_vision_model(tmp_path / "bad", corpus=corpus, rope=MRope(10.0, (2, 2, 2)))
    with pytest.raises(ValueError, match="heads of a multiple of 4"):
        build_tiny_vision_model(tmp_path / "bad", corpus=corpus, tower=VisionTower(2, 64, 3))
