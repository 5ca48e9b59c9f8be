"""bench/device_check.py on the CPU: the GPU script's measuring path, end to end, on the tiny model.

The maze needs a warm start before groups have reward variance, which takes minutes on this CPU;
here the letters agent (whose reward varies from the first step) stands in for it, so what is
checked is the script's own work: the run it configures, the numbers it extracts, the JSON.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agents.letters.main import app
from agents.letters.run_files import QUESTIONS, serving

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "device_check.py"


def _module() -> object:
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_run_writes_the_measurements(tiny_model_dir: Path, tmp_path: Path) -> None:
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps({"question": q}) + "\n" for q in QUESTIONS[:4]))
    out = tmp_path / "device_check.json"
    device_check = _module()
    with serving(app) as agent_url:
        code = device_check.main(  # type: ignore[attr-defined]
            [
                *("--device", "cpu", "--model", str(tiny_model_dir), "--agent", agent_url),
                *("--train-file", str(rows), "--steps", "2", "--rows", "2", "--generations", "4"),
                *("--run-dir", str(tmp_path / "run"), "--out", str(out)),
            ]
        )
    assert code == 0
    result = json.loads(out.read_text())
    times = result["step_time_s"]
    assert len(times["rollouts"]) == len(times["update"]) == len(times["adapter_load"]) == 2
    assert all(seconds > 0 for seconds in times["rollouts"] + times["update"] + times["adapter_load"])
    assert result["updates_applied"] == 2
    assert result["sampled_tokens_per_s"]["median"] > 0 and all(t > 0 for t in result["sampled_tokens"])
    # float32 on both sides of the CPU: the sampler's logprobs are the learner's to rounding.
    assert all(0 <= kl < 1e-5 for kl in result["logprob_mismatch_kl"]["per_update"])
    assert result["peak_memory_gb"]["learner_and_hf_engine_rss"] > 0.1
    assert result["plan"]["placement"]["learner"] == "cpu" and result["plan"]["fits"]
    assert result["learner_memory_peak_gb"] is None  # a CUDA figure: absent on the CPU
    assert math.isfinite(result["seconds"])


def test_missing_cuda_or_vllm_fails_with_a_sentence() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cuda"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert done.stderr.startswith("device_check: ")
    assert "sees no CUDA device" in done.stderr or "--vllm-python" in done.stderr


def test_the_online_mode_stops_at_once_without_nvidia_smi(tmp_path: Path) -> None:
    # A PATH with only what the script needs before its first check: no nvidia-smi on it.
    for tool in ("dirname", "timeout"):
        (tmp_path / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    done = subprocess.run(
        ["/bin/bash", str(SCRIPT.with_suffix(".sh")), "--online"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(tmp_path)},
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "device_check: nvidia-smi is not installed: this check needs an NVIDIA GPU and its driver"
    )


def test_the_offline_check_on_cuda_without_a_gpu_fails_with_a_sentence(tmp_path: Path) -> None:
    done = subprocess.run(
        ["/bin/bash", str(SCRIPT.with_suffix(".sh")), "--out", str(tmp_path / "device_check.json")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable, "DEVICE_CHECK_WORK": str(tmp_path / "work")},
    )
    assert done.returncode == 1
    assert "sees no CUDA device: use --device cpu --tiny for the dry run" in done.stderr


@pytest.mark.slow
def test_the_offline_check_dry_run_on_the_cpu_writes_a_complete_report(tmp_path: Path) -> None:
    """bench/device_check.sh --device cpu --tiny: every stage of the GPU check, tiny, on this CPU."""
    out = tmp_path / "out" / "device_check.json"
    done = subprocess.run(
        ["/bin/bash", str(SCRIPT.with_suffix(".sh")), "--device", "cpu", "--tiny", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHON": sys.executable, "DEVICE_CHECK_WORK": str(tmp_path / "work")},
    )
    log = (out.parent / "device_check.log").read_text() if (out.parent / "device_check.log").exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr + log[-3000:]
    report = json.loads(out.read_text())
    assert report["passed"] and report["device"] == "cpu" and report["torch"]
    stages = report["stages"]
    assert list(stages) == ["tests", "demo", "vision", "memory", "moe", "gateway"]
    # No CUDA here: the tests marked gpu are deselected, and the report says so.
    assert stages["tests"]["status"] == "skipped" and "no CUDA device" in stages["tests"]["sentence"]
    assert all(stages[name]["status"] == "ok" for name in ("demo", "vision", "memory", "moe", "gateway"))
    for name, observation in (("demo", "text"), ("vision", "image")):
        demo = stages[name]["results"]
        assert demo["plan"] == f"tiny ({observation})"
        assert set(demo["success_rate"]) == {"before", "after"}
        assert len(demo["step_time_s"]["rollouts"]) == 2 and set(demo["step_time_s"]["median"]) == {
            "rollouts",
            "update",
            "adapter_load",
        }
    models = stages["memory"]["results"]["models"]
    assert list(models) == ["qwen2.5-0.5b", "qwen2.5-3b", "llama-3-8b"]
    for model in models.values():
        assert [update["checkpointing"] for update in model["updates"]] == [False, True]
        assert all(update["tokens_per_s"] > 0 and update["loss_finite"] for update in model["updates"])
        assert all(
            "LoRA inputs kept for backward" in update["plan"]["items_gb"] for update in model["updates"]
        )
        assert [level["calls"] for level in model["sampling"]] == [1, 8, 64]
        assert all(level["engine_step_ms"] > 0 and level["model_step_ms"] > 0 for level in model["sampling"])
        mismatch = model["sampler_vs_learner"]
        assert (
            mismatch["same_weights"] and mismatch["tokens"] > 0 and mismatch["k3_kl_mean"] < 1e-6
        )  # float32
    moe = stages["moe"]["results"]
    assert moe["attention"] == "rftkit_chunked"
    assert [update["tokens"] for update in moe["updates"]] == [48, 96]
    for update in moe["updates"]:
        items = update["plan"]["items_gb"]
        assert update["loss_finite"] and "stacks rebuilt with LoRA for the backward" in items
        assert not any(label.startswith("eager attention") for label in items)
    rows = stages["gateway"]["results"]["rows"]
    assert [row["clients"] for row in rows] == [1, 4] and all(row["requests_per_s"] > 0 for row in rows)
