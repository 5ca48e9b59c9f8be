"""`lora.adapt_vision` beyond the language model is refused with engine: vllm, which serves LoRA on the
language model only: by the config every command loads (rft train, rft plan) and by rft demo --vision."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from handlers.cli import main as rft
from trainer.config import TrainConfig, vision_lora_refusal

SENTENCE = "vLLM applies LoRA to the language model only, not to the vision tower or its projector"


def _config_file(tmp_path: Path, adapt_vision: str, engine: str) -> Path:
    path = tmp_path / "train.yaml"
    fields = {"model": "models/unused", "engine": engine, "lora": {"adapt_vision": adapt_vision}}
    path.write_text(yaml.safe_dump(fields))
    return path


@pytest.mark.parametrize("command", ["train", "plan"])
@pytest.mark.parametrize("adapt_vision", ["projector", "all"])
def test_train_and_plan_refuse_vision_adapters_on_vllm_with_a_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, adapt_vision: str
) -> None:
    code = rft([command, str(_config_file(tmp_path, adapt_vision, "vllm"))])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"lora.adapt_vision: {adapt_vision} with engine: vllm: {SENTENCE}" in err
    assert "lora.adapt_vision: none" in err and "engine: hf" in err


def test_what_either_engine_serves_is_accepted() -> None:
    assert (
        TrainConfig.model_validate({"engine": "hf", "lora": {"adapt_vision": "all"}}).lora.adapt_vision
        == "all"
    )
    assert TrainConfig.model_validate({"engine": "vllm"}).lora.adapt_vision == "none"
    assert vision_lora_refusal("none", "vllm") is None and vision_lora_refusal("all", "hf") is None


def test_the_demo_refuses_vision_on_vllm_by_the_same_rule(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        rft(["demo", "--vision", "--engine", "vllm", "--model", "unused"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert (
        f"--vision warm-starts an adapter on the vision tower too: {vision_lora_refusal('all', 'vllm')}"
        in err
    )
