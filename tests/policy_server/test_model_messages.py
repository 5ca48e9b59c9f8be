"""What a user reads when a model is missing: `rft model` without a model to write, and a vllm engine
without a vLLM to start; each names settings that exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from handlers.cli import main as rft
from policy_server.engines import VLLMEngine, VLLMEngineError
from trainer.config import TrainConfig


def test_rft_model_without_arguments_prints_its_usage_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert rft(["model"]) == 2
    printed = capsys.readouterr()
    assert printed.err.startswith("usage: rft model {tiny,tiny-vision,smollm2} DIR [OPTIONS]\n")
    assert "name the model to write: tiny, tiny-vision, smollm2" in printed.err
    assert rft(["model", "--help"]) == 0


def test_no_vllm_to_start_names_the_settings_that_exist(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RFTKIT_VLLM_PYTHON", raising=False)
    with pytest.raises(VLLMEngineError) as error:
        VLLMEngine(tiny_model_dir).command(8000)
    message = str(error.value)
    assert "set vllm.python in the run's config (`rft serve --vllm-python`) or RFTKIT_VLLM_PYTHON" in message
    assert "attach to a running server with vllm.attach_url (`rft serve --vllm-url`)" in message
    assert "engine.vllm_python" not in message and "base_url" not in message
    # The settings it names are the config's own.
    assert {"python", "attach_url"} <= set(TrainConfig.model_fields["vllm"].annotation.model_fields)
