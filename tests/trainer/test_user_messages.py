"""What a user reads around a run: a mistyped model path, a typo'd config field under another tool's
name, the closing line of a run that never updated, a resumed run's adapter numbers, `rft status`
before the first step, and the warm start's file format as docs/sft.md shows it."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from agents.letters.main import app as letters_app
from agents.letters.run_files import serving, write_run_files
from handlers import RolloutContext, rft_app
from handlers.cli import main as rft
from trainer import cli
from trainer.config import ConfigError, load_config
from trainer.ops import status
from trainer.sft.common import load_demonstrations
from trainer.sft.turns import encode_demonstration

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_a_mistyped_model_path_fails_at_once_with_one_sentence_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "models" / "smolm2"
    path = write_run_files(tmp_path, missing, "http://127.0.0.1:9")
    started = time.monotonic()
    assert cli.main([str(path)]) == 1
    assert rft(["sft", "--model", str(missing), "--data", "demos.jsonl", "--out", str(tmp_path / "a")]) == 2
    # No hub retries: both refusals come at once.
    assert time.monotonic() - started < 20
    train_error, sft_error = capsys.readouterr().err.strip().splitlines()
    assert train_error == (
        f"rft train: model: the model directory {missing} does not exist (rftkit loads models from "
        "local directories only, never from a hub; `rft model tiny|tiny-vision|smollm2 DIR` writes one)"
    )
    assert sft_error.startswith(f"rft sft: the model directory {missing} does not exist")


def test_config_fields_under_other_tools_names_get_a_hint(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_text('{"q": 1}\n')
    (tmp_path / "run.yaml").write_text(
        "train_file: train.jsonl\nlora: {rank: 8, alpha: 16}\nvllm: {base_url: 'http://x'}\nlr: 0.1\n"
    )
    with pytest.raises(ConfigError) as error:
        load_config(tmp_path / "run.yaml")
    message = str(error.value)
    assert "lora.rank: Extra inputs are not permitted (did you mean 'r'?)" in message
    assert "lora.alpha: Extra inputs are not permitted (did you mean 'lora_alpha'?)" in message
    assert "vllm.base_url: Extra inputs are not permitted (did you mean 'attach_url'?)" in message
    assert "lr: Extra inputs are not permitted (did you mean 'learning_rate'?)" in message


def _constant_app() -> Any:
    async def rollout(row: Any, ctx: RolloutContext) -> float:
        async with ctx.async_openai_client() as client:
            await client.chat.completions.create(
                model=ctx.model_id, messages=[{"role": "user", "content": "hi"}]
            )
        return 1.0

    return rft_app(rollout)


def test_a_run_that_never_updates_says_one_step_and_points_to_a_warm_start(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving(_constant_app()) as agent_url:
        path = write_run_files(tmp_path, tiny_model_dir, agent_url, max_steps=1, eval_file=None)
        assert cli.main([str(path)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"rft train: 1 step done in {tmp_path / 'run'}; no update was applied")
    assert "warm-start an adapter on demonstrations with `rft sft --data FILE`" in last
    assert "(its format: docs/sft.md) and set init_adapter to it" in last
    assert "`rft show RUN --export-demos FILE --min-reward X`" in last
    assert (REPO_ROOT / "docs" / "sft.md").is_file()


def test_a_resumed_run_serves_each_adapter_under_its_own_number(tiny_model_dir: Path, tmp_path: Path) -> None:
    with serving(letters_app) as agent_url:
        path = write_run_files(tmp_path, tiny_model_dir, agent_url, max_steps=2, eval_file=None)
        assert cli.main([str(path)]) == 0
        assert cli.main([str(path), "--resume", "--max-steps", "3"]) == 0
    log = (tmp_path / "run" / "train.log").read_text()
    served = re.findall(r"step (\d+): adapter v(\d+) served(.*)$", log, flags=re.MULTILINE)
    # One number per adapter: the resumed process serves v3 as v3, not as its second load.
    assert served == [("1", "1", ""), ("2", "2", ""), ("3", "3", "")]


def test_status_before_the_first_step_says_the_run_is_in_its_first_evaluation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.log").write_text("2026-12-04 INFO trainer.run: starting\n")
    assert status.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == (
        f"{tmp_path}: the run is in its first evaluation or step (no step finished yet); "
        f"its log so far: {tmp_path / 'train.log'}"
    )
    # A directory no run wrote is still named as the wrong one.
    assert status.main([str(tmp_path / "elsewhere")]) == 2


def test_the_warm_start_example_in_docs_sft_md_is_a_demonstration(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    text = (REPO_ROOT / "docs" / "sft.md").read_text()
    (example,) = re.findall(r"```json\n(.*?)```", text, flags=re.DOTALL)
    (tmp_path / "demos.jsonl").write_text(json.dumps(json.loads(example)) + "\n")
    (demonstration,) = load_demonstrations(tmp_path / "demos.jsonl")
    (encoded,) = encode_demonstration(AutoTokenizer.from_pretrained(str(tiny_model_dir)), demonstration)
    learned = sum(encoded.loss_mask)
    assert 0 < learned < len(encoded.input_ids)
