"""`rft eval`: a finished run's base and final adapter evaluated again give the run's own first and last
evaluations to the bit (same seeds); the intervals and the paired difference on hand-checked numbers;
the refusals a user sees."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from agents.letters.main import app
from agents.letters.run_files import serving, write_run_files
from trainer.config import load_config
from trainer.evaluate.cli import main
from trainer.evaluate.stats import Z, paired_difference, pooled, successes
from trainer.loop import train

# What an evaluation of `rft train` and one of `rft eval` must agree on, to the bit.
SAME = ("success_rate", "mean_reward", "scored", "failed", "agent_metrics")


def test_rft_eval_reproduces_the_runs_first_and_last_evaluations(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving(app) as agent_url:
        # Sampled evaluations (temperature 1, two rollouts a row): only the same seeds give the same
        # rewards; greedy ones would agree whatever the seeds.
        config_path = write_run_files(
            tmp_path,
            tiny_model_dir,
            agent_url,
            max_steps=2,
            save_steps=2,
            eval_temperature=1.0,
            eval_generations=2,
        )
        summary = train(load_config(config_path))
        assert summary.adapter_dir is not None
        capsys.readouterr()
        out = tmp_path / "eval"
        monkeypatch.chdir(tmp_path)  # the adapter named from where the command runs, as a user would
        assert main([str(config_path), "--base", "--adapter", "run/adapters/v2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out

    first, last = summary.evaluations[0], summary.evaluations[-1]
    assert (first["step"], first["adapter_version"], last["step"], last["adapter_version"]) == (0, 0, 2, 2)
    # The two policies differ, so each match below means something.
    assert first["mean_reward"] != last["mean_reward"]
    report = json.loads((out / "eval.json").read_text())
    base, adapter = report["policies"]
    assert (base["name"], base["adapter"]) == ("base", None)
    assert (adapter["name"], adapter["adapter"]) == ("run/adapters/v2", str(summary.adapter_dir))
    assert {key: base[key] for key in SAME} == {key: first[key] for key in SAME}
    assert {key: adapter[key] for key in SAME} == {key: last[key] for key in SAME}
    assert (report["rows"], report["samples"], report["temperature"]) == (2, 2, 1.0)

    # Each interval is centred on the run's own figure; the difference is the two figures' difference.
    assert (
        base["reward"]["estimate"] == first["mean_reward"]
        and base["success"]["estimate"] == first["success_rate"]
    )
    assert base["reward"]["low"] <= base["reward"]["estimate"] <= base["reward"]["high"]
    (difference,) = report["differences"]
    assert difference["name"] == "run/adapters/v2" and difference["reward"]["rows"] == 2
    assert difference["reward"]["estimate"] == pytest.approx(
        last["mean_reward"] - first["mean_reward"], abs=1e-12
    )
    assert [len(row["rewards"]["base"]) for row in report["per_row"]] == [2, 2]

    assert base["tokens"]["prefill"] > 0 and base["tokens"]["sample"] > 0 and base["cost_usd"] > 0
    assert report["tokens"]["sample"] == base["tokens"]["sample"] + adapter["tokens"]["sample"]
    assert "| policy | success | mean reward |" in printed and f"| {adapter['name']} |" in printed, printed
    assert (out / "eval.md").read_text() in printed
    assert (out / "eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_intervals_and_the_paired_difference_on_hand_checked_numbers() -> None:
    base = [[0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [1.0, 0.0]]  # row means 0.5, 1, 0, 0.5
    tuned = [[1.0, 1.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0]]  # row means 1, 1, 0.5, 0.5

    # Mean 0.5; the row means deviate by 0, 0.5, -0.5, 0: sample variance 0.5 / 3 = 1/6, so
    # SE = sqrt(1/6 / 4) = sqrt(1/24) = 0.204124 and 1.96 SE = 0.400076.
    interval = pooled(base)
    assert interval.estimate == 0.5 and interval.rows == 4
    assert interval.high - 0.5 == pytest.approx(1.959964 * math.sqrt(1 / 24), abs=1e-6)
    assert interval.low == pytest.approx(0.5 - 0.400076, abs=1e-6)

    # Per-row differences 0.5, 0, 0.5, 0: mean 0.25, sample variance 1/12, SE = sqrt(1/48),
    # 1.96 SE = 0.282896.
    difference = paired_difference(tuned, base)
    assert difference.estimate == 0.25 and difference.rows == 4
    assert difference.high == pytest.approx(0.25 + 0.282896, abs=1e-6)
    assert difference.low == pytest.approx(0.25 - Z * math.sqrt(1 / 48), abs=1e-12)

    # Successes are rewards above the threshold; a row the base never scored (its rollouts failed) is
    # left out of the pairing: differences 1 - 0.5 = 0.5 and 0.5 - 0 = 0.5, no spread at all.
    assert successes([[0.2, 0.9], []], 0.5) == [[0.0, 1.0], []]
    partial = paired_difference([[1.0, 1.0], [0.5, 0.5], [1.0, 1.0]], [[0.0, 1.0], [0.0, 0.0], []])
    assert (partial.estimate, partial.low, partial.high, partial.rows) == (0.5, 0.5, 0.5, 2)
    # Unequal counts: the pooled mean counts rollouts, not rows ((1 + 0 + 0) / 3).
    assert pooled([[1.0], [0.0, 0.0], []]).estimate == pytest.approx(1 / 3)
    # One row: an estimate, no interval.
    single = pooled([[1.0, 0.0]])
    assert single.estimate == 0.5 and math.isnan(single.low) and math.isnan(single.high)
    with pytest.raises(ValueError, match="paired rows differ in number: 1 and 2"):
        paired_difference([[1.0]], [[1.0], [0.0]])


def test_a_config_without_an_eval_file_or_a_wrong_adapter_is_refused_with_what_to_do(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_path = write_run_files(tmp_path, tiny_model_dir, "http://127.0.0.1:9", eval_file=None)
    assert main([str(config_path)]) == 2
    assert capsys.readouterr().err == (
        f"rft eval: {config_path} has no eval_file, so there is nothing to evaluate on: set eval_file to "
        "a JSONL file of rows (the format of train_file) in the config, or pass --set eval_file=FILE\n"
    )

    with_eval = yaml.safe_load(config_path.read_text()) | {"eval_file": "eval.jsonl"}
    config_path.write_text(yaml.safe_dump(with_eval))
    assert main([str(config_path), "--adapter", str(tmp_path)]) == 2
    assert f"--adapter {tmp_path} is not a peft adapter directory" in capsys.readouterr().err
    assert main([str(config_path), "--samples", "0"]) == 2
    assert "--samples 0: give 1 or more rollouts per row" in capsys.readouterr().err
