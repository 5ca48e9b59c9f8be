"""``rft sft``: rendering through the chat template, assistant-only loss, a falling loss, the adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from agents.maze.demonstrations import episode_demonstrations, maze_demonstrations
from agents.maze.generator import generate
from trainer.sft.cli import main
from trainer.sft.common import DemonstrationError, StopAtLoss, load_demonstrations
from trainer.sft.text import run_sft
from trainer.sft.turns import encode_demonstration

TARGETS = ["embed_tokens", "q_proj", "v_proj", "lm_head"]


def test_only_the_assistants_tokens_carry_loss(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    # The second move: the previous move and its observation, then the move to learn.
    demo = episode_demonstrations(generate(7, 4))[1]
    # ChatML's turns only append, so the turns merge into one sequence, as sampled calls do.
    (encoded,) = encode_demonstration(tokenizer, demo)
    assert len(encoded.input_ids) == len(encoded.loss_mask)
    # The whole conversation exactly as the template renders it (the newline after the last turn's
    # end-of-turn token kept, masked), so the sequence is a single rendering's.
    rendered = tokenizer.apply_chat_template(demo["messages"], tools=demo["tools"], tokenize=False)
    assert tokenizer.decode(encoded.input_ids) == rendered
    # Masked-in runs are exactly the assistant's tool calls, each ending with its end-of-turn token.
    runs, current = [], []
    for token, keep in zip(encoded.input_ids, encoded.loss_mask, strict=True):
        if keep:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    calls = [m for m in demo["messages"] if m["role"] == "assistant"]
    assert len(runs) == len(calls)
    for text, message in zip(runs, calls, strict=True):
        arguments = json.loads(message["tool_calls"][0]["function"]["arguments"])
        assert text == (
            '<tool_call>\n{"name": "move", "arguments": '
            + json.dumps(arguments)
            + "}\n</tool_call><|im_end|>"
        )
    # The system prompt, tool list, observations and role headers are context only.
    context = tokenizer.decode(
        [t for t, keep in zip(encoded.input_ids, encoded.loss_mask, strict=True) if not keep]
    )
    assert "Moved. Goal:" in context and "<tools>" in context and "<|im_start|>assistant\n" in context
    assert '"arguments": {"direction"' not in context


def test_a_demonstration_without_assistant_turns_is_refused(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(DemonstrationError, match="assistant"):
        encode_demonstration(tokenizer, {"messages": [{"role": "user", "content": "hi"}]})


def test_sft_lowers_the_loss_and_saves_a_peft_adapter(tiny_model_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    result = run_sft(
        tiny_model_dir,
        maze_demonstrations(8),
        tmp_path / "adapter",
        steps=12,
        batch_size=2,
        target_modules=TARGETS,
        seed=0,
    )
    assert len(result.losses) == 12
    assert sum(result.losses[-3:]) / 3 < 0.6 * result.losses[0]
    assert (result.adapter_dir / "adapter_config.json").is_file()
    config = json.loads((result.adapter_dir / "adapter_config.json").read_text())
    assert set(config["target_modules"]) == set(TARGETS)
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), result.adapter_dir
    )
    assert any("lora_B" in name for name, _ in model.named_parameters())


def test_a_warm_start_stops_at_the_first_check_that_reaches_its_held_out_target(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    held_out = maze_demonstrations(2, first_seed=500_000)

    def warm_start(name: str, target: float) -> list[float]:
        result = run_sft(
            tiny_model_dir,
            maze_demonstrations(8),
            tmp_path / name,
            steps=12,
            batch_size=2,
            target_modules=TARGETS,
            seed=0,
            stop=StopAtLoss(held_out, target, every=3),
        )
        assert (result.adapter_dir / "adapter_config.json").is_file()
        assert list(result.held_out_losses) == list(range(3, len(result.losses) + 1, 3))
        return [*result.held_out_losses.values()]

    # Out of reach: every check runs, and the held-out loss falls as the warm start learns.
    checks = warm_start("all", target=0.0)
    assert len(checks) == 4 and checks[-1] < checks[0]
    # A target between the second and third checks ends the run at the third, on the same numbers
    # (the checks draw nothing from the run's random streams).
    assert warm_start("stopped", target=(checks[1] + checks[2]) / 2) == checks[:3]


def test_cli_trains_from_a_jsonl_file(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    data = tmp_path / "demos.jsonl"
    demos = maze_demonstrations(2)
    data.write_text("".join(json.dumps(demo) + "\n" for demo in demos))
    assert load_demonstrations(data) == demos
    out = tmp_path / "adapter"
    code = main(["--model", str(tiny_model_dir), "--data", str(data), "--out", str(out), "--steps", "2"])
    assert code == 0 and (out / "adapter_config.json").is_file()
    assert "sft step 2/2" in capsys.readouterr().out
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "no messages"}\n')
    assert main(["--model", str(tiny_model_dir), "--data", str(bad), "--out", str(out)]) == 2
    assert "messages" in capsys.readouterr().err
