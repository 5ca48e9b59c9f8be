"""Asynchronous training (max_off_policy_steps = 1) against agents with long-tailed episode times.

One test, three runs sharing their setup: a run repeated gives the same numbers and the same adapter
(rollouts finish in a different order each time; versions are chosen by step, not by timing), every
step records its staleness, and a run that stops right after its step-2 checkpoint, while step 3's
rollouts are in flight, resumes without losing or repeating them and ends with the same adapter.

The stop is staged from the first run's own files, as a kill would leave them (checkpoints are
atomic and a resume reads nothing else; tests/trainer/test_resume.py SIGKILLs a real process): its
run directory without the step-3 checkpoint, and with half of step 3's finished rollouts taken out
of the checkpoint, as if they had still been running. In process, so it costs no second cold start.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from agents.letters.run_files import QUESTIONS, serving, write_run_files
from agents.letters.sleepy import app
from tests.trainer.test_determinism import _without_timing
from trainer.config import load_config
from trainer.loop import train
from trainer.run import LOG_FILE, RunSummary


def _records(summary: RunSummary) -> list[dict[str, Any]]:
    lines = (summary.run_dir / "metrics.jsonl").read_text().splitlines()
    return _without_timing([json.loads(line) for line in lines])


def _weights(summary: RunSummary) -> dict[str, torch.Tensor]:
    assert summary.adapter_dir is not None
    return load_file(summary.adapter_dir / "adapter_model.safetensors")


def _same_weights(first: RunSummary, second: RunSummary) -> bool:
    a, b = _weights(first), _weights(second)
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def _stop_after_step_2(finished_run: Path, stopped: Path) -> tuple[int, int]:
    """``finished_run`` as it stood after its step-2 checkpoint; (kept, to replay) rollouts of step 3."""
    shutil.copytree(finished_run, stopped)
    shutil.rmtree(stopped / "checkpoints" / "step-000003")
    checkpoint = stopped / "checkpoints" / "step-000002"
    # Step 3 samples on the adapter after step 1: version 1, kept in the checkpoint.
    assert (checkpoint / "pinned-adapters" / "v1" / "adapter_config.json").is_file()
    in_flight = json.loads((checkpoint / "rollouts.json").read_text())
    assert [(step["step"], step["adapter_version"]) for step in in_flight] == [(3, 1)]
    finished = in_flight[0]["finished"]
    in_flight[0]["finished"] = {key: kept for key, kept in finished.items() if int(key) % 2 == 0}
    (checkpoint / "rollouts.json").write_text(json.dumps(in_flight))
    kept = len(in_flight[0]["finished"])
    return kept, 8 - kept


def test_async_run_repeats_records_staleness_and_resumes(tiny_model_dir: Path, tmp_path: Path) -> None:
    with serving(app) as agent_url:
        # Batch-invariant numerics (one call per engine batch), as the resume test of the synchronous
        # loop: a call's logprobs then do not depend on which rollouts of which step ran beside it.
        config_path = write_run_files(
            tmp_path,
            tiny_model_dir,
            agent_url,
            eval_file=None,
            max_off_policy_steps=1,
            hf={"max_batch_size": 1},
            save_total_limit=3,
            rollout_timeout_s=600,
        )
        # Episodes of 0.1 s median with a long tail: rollouts finish in a different order every run.
        rows = "".join(json.dumps({"question": q, "sleep_s": 0.1}) + "\n" for q in QUESTIONS[:4])
        (tmp_path / "train.jsonl").write_text(rows)
        first = train(load_config(config_path, ["output_dir=first"]))
        second = train(load_config(config_path, ["output_dir=second"]))
        kept, replayed = _stop_after_step_2(first.run_dir, tmp_path / "stopped")
        resumed = train(load_config(config_path, [f"output_dir={tmp_path / 'stopped'}"]), resume=True)

    records = _records(first)
    assert [record["update"]["applied"] for record in records] == [True, True, True]
    assert records == _records(second) and _same_weights(first, second)
    # Step s samples on the adapter after step s - 2 (version 0 for steps 1 and 2): one version behind
    # the learner from step 2 on, never more.
    assert [record["staleness"] for record in records] == [
        {"mean": 0.0, "max": 0.0},
        {"mean": 1.0, "max": 1.0},
        {"mean": 1.0, "max": 1.0},
    ]
    assert [record["sampled_adapter_versions"] for record in records] == [[0], [0], [1]]

    log = (tmp_path / "stopped" / LOG_FILE).read_text()
    assert f"step 3: {kept} rollouts kept from the checkpoint, {replayed} played again" in log
    assert resumed.steps == 3 and _same_weights(first, resumed)
    resumed_records = _records(resumed)
    assert [record["step"] for record in resumed_records] == [1, 2, 3]
    # Nothing lost or repeated: step 3's batch is the same rollouts (rewards, staleness, tokens trained).
    for key in ("reward_mean", "staleness", "rollouts", "update"):
        assert resumed_records[2][key] == records[2][key], key
