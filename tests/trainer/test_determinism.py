"""Same seed, same numbers: a short `rft train` run with concurrent rollouts, repeated with a process
keeping a core busy beside it (so requests share batches differently), gives the same metrics and
the same adapter weights, bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from agents.letters.main import app
from agents.letters.run_files import serving, write_run_files
from trainer.config import load_config
from trainer.loop import train

# Wall-clock readings: the only numbers allowed to differ.
TIMING_KEYS = {"time", "time_s", "per_s", "seconds"}


def _without_timing(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_timing(item) for key, item in value.items() if key not in TIMING_KEYS}
    if isinstance(value, list):
        return [_without_timing(item) for item in value]
    return value


def _run(directory: Path, model_dir: Path) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor]]:
    with serving(app) as agent_url:
        # 5 rows x 4 rollouts at once per step, two turns each: calls join and leave shared batches,
        # and a prefill can take more prompts than the 16 padded rows (test_batch_invariance.py).
        config = load_config(
            write_run_files(directory, model_dir, agent_url, rows_per_step=5, eval_temperature=1.0)
        )
        summary = train(config)
    lines = (config.output_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines] + [{"evaluations": summary.evaluations}]
    assert summary.adapter_dir is not None
    return _without_timing(records), load_file(summary.adapter_dir / "adapter_model.safetensors")


def test_a_run_repeats_exactly_with_a_busy_core_beside_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    first, first_weights = _run(tmp_path / "quiet", tiny_model_dir)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        second, second_weights = _run(tmp_path / "busy", tiny_model_dir)
    finally:
        busy.kill()
        busy.wait()
    assert len(first) == 4 and all(record["update"]["applied"] for record in first[:3])
    assert first == second
    assert first_weights.keys() == second_weights.keys()
    for name, tensor in first_weights.items():
        assert torch.equal(tensor, second_weights[name]), name
