"""The run-level reasoning_effort (issue 49, item 4): refused at run start for a family without the
switch, and the note `rft plan` and `rft train` give when max_completion_length is below what the
family's reasoning takes at the effort in use. The gateway's part is in
tests/policy_server/test_family_gpt_oss.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from policy_server.models.families import family
from trainer.config import ConfigError, TrainConfig, load_config
from trainer.engine import engine_parsers
from trainer.errors import TrainingError
from trainer.reasoning import reasoning_refusal
from trainer.scale import plan_cli


@pytest.fixture(scope="module")
def tiny_gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return family("gpt_oss").build_tiny(tmp_path_factory.mktemp("tiny-gpt-oss") / "model")


def test_a_family_without_the_switch_refuses_the_run_level_effort_at_run_start(tiny_model_dir: Path) -> None:
    with pytest.raises(TrainingError) as refused:
        engine_parsers(TrainConfig(model=str(tiny_model_dir), reasoning_effort="low"), tiny_model_dir)
    assert str(refused.value) == (
        "reasoning_effort 'low' cannot be applied to every call: The served model's family (llama) has no "
        "reasoning_effort switch; leave reasoning_effort unset."
    )
    engine_parsers(TrainConfig(model=str(tiny_model_dir)), tiny_model_dir)  # unset: nothing to refuse
    # Qwen3's switch is another one, and the sentence names it.
    assert reasoning_refusal(TrainConfig(reasoning_effort="high"), family("qwen3")) == (
        "reasoning_effort 'high' cannot be applied to every call: Qwen3 has no reasoning_effort; leave it "
        'unset: it thinks unless a call sends chat_template_kwargs {"enable_thinking": false}.'
    )


def test_an_effort_no_family_reads_is_refused_at_config_load(tmp_path: Path) -> None:
    (tmp_path / "run.yaml").write_text("reasoning_effort: extreme\n")
    with pytest.raises(ConfigError) as refused:
        load_config(tmp_path / "run.yaml")
    assert "reasoning_effort: Input should be 'low', 'medium' or 'high'" in str(refused.value)
    (tmp_path / "run.yaml").write_text("reasoning_effort: low\n")
    assert load_config(tmp_path / "run.yaml").reasoning_effort == "low"


def _plan(tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str], **fields: object) -> str:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({"model": str(model), **fields}))
    assert plan_cli.main([str(path)]) == 0
    return capsys.readouterr().out


def test_the_plan_says_when_max_completion_length_is_below_the_familys_reasoning(
    tiny_gpt_oss: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    out = _plan(tmp_path, tiny_gpt_oss, capsys)
    assert out.strip().splitlines()[-1] == (
        "note: max_completion_length 512 is below the 4096 tokens the gpt_oss family's reasoning takes at "
        "reasoning_effort medium, the family's default (reasoning_effort unset) (docs/models.md): calls "
        "may end mid-reasoning with no answer; raise max_completion_length to 4096"
    )
    low = _plan(tmp_path, tiny_gpt_oss, capsys, reasoning_effort="low", max_completion_length=1000)
    assert "below the 1024 tokens the gpt_oss family's reasoning takes at reasoning_effort low " in low
    high = _plan(tmp_path, tiny_gpt_oss, capsys, reasoning_effort="high", max_completion_length=4096)
    assert high.strip().endswith("raise max_completion_length to 16384, or set reasoning_effort: medium")
    assert "note:" not in _plan(tmp_path, tiny_gpt_oss, capsys, max_completion_length=4096)
    # rft train says it as it starts.
    with caplog.at_level(logging.WARNING, logger="trainer"):
        engine_parsers(TrainConfig(model=str(tiny_gpt_oss), reasoning_effort="low"), tiny_gpt_oss)
    assert "max_completion_length 512 is below the 1024 tokens" in caplog.text
