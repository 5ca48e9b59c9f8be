"""A run SIGKILLed in the middle of step 2 and resumed ends with the same adapter, bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agents.letters.main import app
from agents.letters.run_files import serving, write_run_files
from trainer.cli import main as cli_main
from trainer.config import load_config
from trainer.learner.checkpoint import latest_checkpoint
from trainer.loop import train
from trainer.run import LOG_FILE

KILL_AT = "step 2: rollouts started"


def _wait_for_line(path: Path, text: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.is_file() and text in path.read_text():
            return
        if process.poll() is not None:
            raise AssertionError(f"rft train exited ({process.returncode}) before {text!r}")
        time.sleep(0.02)
    raise AssertionError(f"{text!r} did not appear in {path} within {timeout_s} s")


def test_sigkill_mid_step_then_resume_matches_an_uninterrupted_run(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving(app) as agent_url:
        # Exact equality needs batch-invariant numerics: with one call per engine batch, a call's logits
        # (and so the recorded behavior logprobs) do not depend on which rollouts ran beside it. Each
        # rollout's own sampling seed makes its tokens independent of the order requests arrive in.
        config_path = write_run_files(
            tmp_path, tiny_model_dir, agent_url, eval_file=None, hf={"max_batch_size": 1}
        )
        uninterrupted = train(load_config(config_path, ["output_dir=uninterrupted"]))

        killed_dir = tmp_path / "killed"
        command = [
            sys.executable,
            "-m",
            "handlers.cli",
            "train",
            str(config_path),
            "--output-dir",
            str(killed_dir),
        ]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            # Only bounds a hang: the wait ends as soon as the line appears or the process exits, and
            # a machine shared with other work may take minutes to import, build and play step 1.
            _wait_for_line(killed_dir / LOG_FILE, KILL_AT, process, timeout_s=900)
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        assert process.returncode == -signal.SIGKILL
        latest = latest_checkpoint(killed_dir / "checkpoints")
        assert latest is not None and latest.name == "step-000001", "the kill did not land in step 2"
        run_id = json.loads((latest / "state.json").read_text())["mlflow_run_id"]

        # Starting over in a run directory that holds checkpoints is refused with the way out.
        assert cli_main([str(config_path), "--output-dir", str(killed_dir)]) == 1
        assert "pass --resume" in capsys.readouterr().err

        resumed = train(load_config(config_path, [f"output_dir={killed_dir}"]), resume=True)

    assert resumed.steps == uninterrupted.steps == 3
    assert resumed.adapter_dir is not None and uninterrupted.adapter_dir is not None
    expected = load_file(uninterrupted.adapter_dir / "adapter_model.safetensors")
    actual = load_file(resumed.adapter_dir / "adapter_model.safetensors")
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[name], actual[name]) for name in expected)
    # Nothing lost or repeated: each step logged once, the same MLflow run continued.
    steps = [json.loads(line)["step"] for line in (killed_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    final_state = json.loads((killed_dir / "checkpoints" / "step-000003" / "state.json").read_text())
    assert final_state["mlflow_run_id"] == run_id
    assert [record["step"] for record in final_state["history"]] == [1, 2, 3]
    rewards = [record["reward_mean"] for record in final_state["history"]]
    assert rewards == [record["reward_mean"] for record in uninterrupted.history]
