"""Multi-turn warm starts on every family (issue 50.1): each assistant turn of a demonstration is
trained after the very prompt the engine sends at that turn, its completion the tokens the family's
parsers read back into that turn; turns merge into one sequence where the next prompt extends it,
as sampled calls merge. Before, Qwen3's and harmony's templates (which drop earlier think blocks and
analysis) refused docs/sft.md's own example: "the chat template does not render this conversation
prefix-preservingly"."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoConfig, GenerationConfig

from agents.maze.demonstrations import maze_demonstrations
from policy_server.http import normalize_messages
from policy_server.models import VisionInputs, load_tokenizer
from policy_server.models.families import TinySizes, family
from trainer.sft.cli import main as sft
from trainer.sft.common import DemonstrationError
from trainer.sft.turns import EncodedDemonstration, encode_demonstration
from trainer.sft.vision import encode_vision_demonstration

REPO_ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ("llama", "qwen3", "qwen3_5", "gpt_oss", "gemma4", "qwen2_vl", "qwen3_vl")
SIZES = TinySizes(hidden_size=64, vocab_size=512)


def docs_example() -> dict[str, Any]:
    """docs/sft.md's example demonstration: a tool call, its result, then an answer."""
    (example,) = re.findall(r"```json\n(.*?)```", (REPO_ROOT / "docs" / "sft.md").read_text(), re.DOTALL)
    return json.loads(example)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Any:
    built: dict[str, Path] = {}

    def model(name: str) -> Path:
        if name not in built:
            built[name] = family(name).build_tiny(tmp_path_factory.mktemp(name) / "model", sizes=SIZES)
        return built[name]

    return model


def trained_turns(sequences: list[EncodedDemonstration]) -> Iterator[tuple[list[int], list[int]]]:
    """Each trained run of tokens with everything before it in its sequence, in order."""
    for sequence in sequences:
        start = None
        for position, kept in enumerate([*sequence.loss_mask, False]):
            if kept and start is None:
                start = position
            elif not kept and start is not None:
                yield sequence.input_ids[:start], sequence.input_ids[start:position]
                start = None


def engine_prompt(tokenizer: Any, messages: list[dict[str, Any]], tools: Any) -> list[int]:
    """What the hf engine sends the model (policy_server/engines/hf.py, ``_template_ids``)."""
    return list(
        tokenizer.apply_chat_template(
            normalize_messages(messages), tools=tools or None, add_generation_prompt=True, return_dict=False
        )
    )


def check_turns_as_sampled(name: str, model_dir: Path, demonstration: dict[str, Any]) -> list[Any]:
    """Every assistant turn is trained once, after the engine's prompt for it, ending at a stop token,
    and parses back into the turn; returns the sequences."""
    tokenizer = load_tokenizer(model_dir, None)
    stops = GenerationConfig.from_pretrained(model_dir).eos_token_id
    stops = set(stops if isinstance(stops, list) else [stops])
    sequences = encode_demonstration(tokenizer, demonstration)
    messages, tools = demonstration["messages"], demonstration.get("tools")
    turns = [index for index, message in enumerate(messages) if message["role"] == "assistant"]
    trained = list(trained_turns(sequences))
    assert len(trained) == len(turns)
    for index, (before, completion) in zip(turns, trained, strict=True):
        assert before == engine_prompt(tokenizer, messages[:index], tools)
        assert completion[-1] in stops
        parsed = family(name).with_tools(tools).parse(tokenizer, completion[:-1], tools=bool(tools))
        wanted = messages[index]
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls]
        assert calls == [
            (c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in wanted.get("tool_calls") or []
        ]
        assert (parsed.content or "").strip() == (wanted.get("content") or "")
        if wanted.get("reasoning_content"):
            assert (parsed.reasoning_content or "").strip() == wanted["reasoning_content"]
    return sequences


@pytest.mark.parametrize("name", FAMILIES)
def test_each_turn_of_the_docs_example_is_trained_as_the_engine_samples_it(name: str, tiny: Any) -> None:
    sequences = check_turns_as_sampled(name, tiny(name), docs_example())
    # Qwen3's template renders an empty think block on the last turn only, so its second prompt does
    # not extend the first turn as sampled: two sequences. ChatML's turns only append: one.
    assert len(sequences) == {"llama": 1, "qwen3": 2}.get(name, len(sequences))


@pytest.mark.parametrize("name", ["qwen3", "gpt_oss"])
def test_reasoning_is_trained_where_the_template_keeps_it(name: str, tiny: Any) -> None:
    demonstration = docs_example()
    for message in demonstration["messages"]:
        if message["role"] == "assistant":
            message["reasoning_content"] = "The charge is a billing matter."
    check_turns_as_sampled(name, tiny(name), demonstration)


def picture_demonstration() -> dict[str, Any]:
    """Two maze moves in one conversation, a picture before each (the maze's own demonstrations)."""
    first, second = maze_demonstrations(1, observation="image")[:2]
    call_id = first["messages"][-1]["tool_calls"][0]["id"]
    later = [dict(message) for message in second["messages"][2:]]
    later[0]["tool_call_id"] = call_id
    return {"messages": first["messages"] + later, "tools": first["tools"]}


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen3_vl"])
def test_a_multi_turn_picture_demonstration_keeps_each_sequences_images(name: str, tiny: Any) -> None:
    demonstration = picture_demonstration()
    text = check_turns_as_sampled(name, tiny(name), demonstration)
    vision = VisionInputs(tiny(name), AutoConfig.from_pretrained(tiny(name)))
    pictures = encode_vision_demonstration(load_tokenizer(tiny(name), None), vision, demonstration)
    assert len(pictures) == len(text)
    for words, with_images in zip(text, pictures, strict=True):
        assert with_images.image_grid_thw.shape[0] == words.input_ids.count(vision.image_token_id) == 2
        kept = [(t, m) for t, m in zip(with_images.input_ids, with_images.loss_mask, strict=True)]
        assert [(t, m) for t, m in kept if t != vision.image_token_id] == [
            (t, m)
            for t, m in zip(words.input_ids, words.loss_mask, strict=True)
            if t != vision.image_token_id
        ]


@pytest.mark.parametrize("name", ["qwen3", "gpt_oss"])
def test_rft_sft_warm_starts_on_the_docs_example(
    name: str, tiny: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "demos.jsonl"
    data.write_text(json.dumps(docs_example()) + "\n")
    out = tmp_path / "adapter"
    args = ["--model", str(tiny(name)), "--data", str(data), "--out", str(out), "--steps", "1"]
    assert sft([*args, "--batch-size", "1", "--target-modules", "q_proj,v_proj"]) == 0
    assert (out / "adapter_config.json").is_file()
    assert re.search(
        r"sft step 1/1  loss \d+\.\d{4}  elapsed \d+s  [\d.]+ steps/s  eta 0s", capsys.readouterr().out
    )


def test_a_demonstration_that_cannot_be_trained_names_its_file_and_line(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "demos.jsonl"
    unanswered = {"messages": [{"role": "user", "content": "hi"}]}
    data.write_text(json.dumps(docs_example()) + "\n\n" + json.dumps(unanswered) + "\n")
    args = ["--model", str(tiny_model_dir), "--data", str(data), "--out", str(tmp_path / "x"), "--steps", "1"]
    assert sft(args) != 0
    assert f"{data}:3: a demonstration needs at least one assistant message" in capsys.readouterr().err
    with pytest.raises(DemonstrationError, match=r"^demonstration 2: "):
        from trainer.sft import trainee_for

        trainee_for(tiny_model_dir, [docs_example(), unanswered], None)
