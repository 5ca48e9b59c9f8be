"""`rft status` and the trainer's Prometheus series, on the run directory of a real one-step `rft train`
(tiny model, hf engine, an agent that fails some rollouts on purpose, the metrics port open).

The agent plays :mod:`letters`, except that every row's 3rd rollout raises (``agent_error``) and its
4th skips its row (``skipped``): failures of two causes without waiting for a deadline.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agents.letters.main import rollout as play_letters
from agents.letters.run_files import serving, write_run_files
from handlers.cli import main as rft
from handlers.context import RolloutContext
from handlers.decorator import rft_app
from trainer.config import load_config
from trainer.loop import train
from trainer.ops.prometheus import PHASES, StepExporter
from trainer.ops.status import read_status, render


def failing_app() -> Any:
    arrivals: Counter[str] = Counter()
    lock = threading.Lock()

    async def rollout(row: dict[str, Any], ctx: RolloutContext) -> Any:
        with lock:
            arrivals[row["question"]] += 1
            arrival = arrivals[row["question"]]
        if arrival == 3:
            raise RuntimeError("the environment crashed")
        if arrival == 4:
            return {"status": "skipped"}
        return await play_letters(row, ctx)

    return rft_app(rollout)


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("status")
    with serving(failing_app()) as agent_url:
        fields = {"eval_file": None, "max_steps": 1, "max_retries": 0, "beta": 0.04}
        config = load_config(write_run_files(directory, tiny_model_dir, agent_url, **fields))
        config.policy_server.metrics_port = 0
        train(config)
    return config.output_dir


def test_rft_status_prints_the_run(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert rft(["status", str(run_dir)]) == 0
    out = capsys.readouterr().out
    (record,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    row = next(line for line in out.splitlines() if line.startswith("| 1 |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1] == f"{record['reward_mean']:.4f}"
    assert cells[3] == "4/8" and cells[4] == "4"
    fidelity = record["fidelity"]
    assert cells[7] == f"{fidelity['logprob_abs_diff_mean']:.2e}/{fidelity['logprob_abs_diff_max']:.2e}"
    assert cells[8] == str(fidelity["prefix_breaks"])
    assert cells[9] == str(fidelity["truncated_calls"])
    assert cells[11] == f"{record['tokens']['train']:,}"
    assert "failed rollouts by cause: agent_error 2, skipped 2" in out
    assert f"estimated cost ${record['cost_usd_total']:.4f}" in out
    assert f"last checkpoint: {run_dir / 'checkpoints' / 'step-000001'}" in out


def test_a_half_written_last_line_is_left_out(run_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    copy.mkdir()
    whole = (run_dir / "metrics.jsonl").read_text()
    (copy / "metrics.jsonl").write_text(whole + whole[: len(whole) // 2])
    status = read_status(copy)
    assert [record["step"] for record in status.records] == [1]
    assert "last checkpoint: none yet" in render(status)


def test_rft_status_names_a_directory_that_is_no_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert rft(["status", str(tmp_path)]) == 2
    assert "holds no metrics.jsonl" in capsys.readouterr().out


def test_the_step_record_becomes_prometheus_series(run_dir: Path) -> None:
    (record,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    registry = CollectorRegistry()
    StepExporter(registry).publish(record["step"], record)
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
    }
    assert samples[("rftkit_train_step", ())] == 1
    assert samples[("rftkit_train_reward_mean", ())] == pytest.approx(record["reward_mean"])
    assert samples[("rftkit_train_success_rate", ())] == pytest.approx(record["success_rate"])
    assert samples[("rftkit_train_kl", ())] == pytest.approx(record["update"]["kl"])
    assert samples[("rftkit_train_clip_fraction", ())] == pytest.approx(record["update"]["clip_fraction"])
    for phase in PHASES:
        assert samples[("rftkit_train_step_seconds", (("phase", phase),))] == pytest.approx(
            record["time_s"][phase]
        )
    for figure in ("logprob_abs_diff_mean", "logprob_abs_diff_max", "ratio_min", "prefix_breaks"):
        assert samples[("rftkit_train_fidelity", (("figure", figure),))] == pytest.approx(
            record["fidelity"][figure]
        )
    assert samples[("rftkit_train_staleness", (("stat", "max"),))] == record["staleness"]["max"] == 0
    assert samples[("rftkit_rollout_failures_total", (("cause", "agent_error"),))] == 2
    assert samples[("rftkit_rollout_failures_total", (("cause", "skipped"),))] == 2
    assert samples[("rftkit_rollout_failures_total", (("cause", "transport"),))] == 0
    assert samples[("rftkit_train_rollouts_total", (("outcome", "ok"),))] == 4
    assert samples[("rftkit_trained_tokens_total", ())] == record["tokens"]["train"] > 0
