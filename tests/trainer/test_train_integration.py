"""`rft train` end to end over real HTTP: tiny model, hf engine, a real agent app on uvicorn."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from agents.letters.main import app
from agents.letters.run_files import serving, write_run_files
from tests.trainer.agent_apps.faulty import make_app
from trainer.config import load_config
from trainer.loop import train


def test_three_steps_advance_the_adapter_and_leave_metrics_and_checkpoints(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    with serving(app) as agent_url:
        config = load_config(write_run_files(tmp_path, tiny_model_dir, agent_url))
        summary = train(config)

    run = config.output_dir
    assert summary.steps == 3
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [1, 2, 3]
    for record in records:
        assert record["rollouts"]["total"] == 8 and record["rollouts"]["failed"] == 0
        # The letters agent reports the length of its replies: averaged over the step's rollouts.
        assert set(record["agent_metrics"]) == {"reply_chars"} and record["agent_metrics"]["reply_chars"] > 0
        assert record["update"]["applied"] is True
        assert record["tokens"]["prefill"] > 0 and record["tokens"]["sample"] > 0
        assert record["tokens"]["train"] > 0
        # Two turns per rollout: merged where the second prompt extends the first token for token (a
        # random tiny model's samples often re-tokenize differently, so not always), never more.
        assert record["tokens"]["train"] <= record["tokens"]["train_per_call"]
        assert (
            record["tokens"]["merge_ratio"] == record["tokens"]["train"] / record["tokens"]["train_per_call"]
        )
        assert set(record["time_s"]) >= {"rollout", "update", "adapter_load", "step"}
        # The learner scores the sampled tokens as the engine did (fp32 both): far inside the default
        # fidelity limit, which this run passes (docs/fidelity.md).
        assert record["fidelity"]["logprob_abs_diff_mean"] < 1e-4
        assert record["fidelity"]["calls"] == 16
    # Each step samples with the adapter the previous step produced: the versions the traces record.
    assert [record["sampled_adapter_versions"] for record in records] == [[0], [1], [2]]
    assert summary.adapter_version == 3 and records[-1]["adapter_version"] == 3
    assert records[-1]["cost_usd_total"] > 0 and summary.cost.dollars == records[-1]["cost_usd_total"]

    # The final adapter is peft format and trained (LoRA B starts at zero).
    assert summary.adapter_dir == run / "adapters" / "v3"
    weights = load_file(summary.adapter_dir / "adapter_model.safetensors")
    assert any("lora_B" in name and torch.count_nonzero(tensor) > 0 for name, tensor in weights.items())
    assert sorted(path.name for path in (run / "adapters").iterdir()) == ["v2", "v3"]

    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == ["step-000002", "step-000003"]
    state = json.loads((run / "checkpoints" / "step-000003" / "state.json").read_text())
    assert state["step"] == 3 and state["position"]["index"] == 2 and state["position"]["epoch"] == 1

    # Before/after evaluation: one rollout per eval row, nothing failed.
    assert [(e["step"], e["scored"], e["failed"]) for e in summary.evaluations] == [(0, 2, 0), (3, 2, 0)]
    table = (run / "eval_table.md").read_text()
    assert "before (step 0)" in table and "after (step 3)" in table
    assert json.loads((run / "eval_table.json").read_text())["after"]["step"] == 3

    mlflow_run = MlflowClient(tracking_uri=config.mlflow_uri).get_run(state["mlflow_run_id"])
    assert mlflow_run.info.status == "FINISHED"
    assert {
        "reward_mean",
        "update/loss",
        "tokens/train",
        "time_s/rollout",
        "fidelity/logprob_abs_diff_max",
    } <= set(mlflow_run.data.metrics)
    assert mlflow_run.data.params["num_generations"] == "4"


def test_failed_rollouts_are_dropped_and_counted_by_cause(tiny_model_dir: Path, tmp_path: Path) -> None:
    # The healthy rollouts (a few short calls to the tiny model, the agent in this process) end within
    # it many times over, on a machine shared with other work; the overrunning ones wait past it
    # whatever it is, so it only sets how long the test idles for their timeout.
    timeout_s = 10.0
    with serving(make_app(overrun_s=timeout_s + 1)) as agent_url:
        config = load_config(
            write_run_files(
                tmp_path,
                tiny_model_dir,
                agent_url,
                eval_file=None,
                max_steps=1,
                rollout_timeout_s=timeout_s,
                max_retries=0,
            )
        )
        summary = train(config)

    (record,) = [json.loads(line) for line in (config.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert record["rollouts"] == {**record["rollouts"], "total": 8, "ok": 4, "failed": 4}
    assert {cause: n for cause, n in record["failures"].items() if n} == {"agent_error": 2, "timeout": 2}
    # Each cause with the first error text it came with and the dataset row that rollout played.
    errors = record["failure_errors"]
    assert set(errors) == {"agent_error", "timeout"}
    row = r" \(train\.jsonl row [1-4]\)"
    assert re.fullmatch(r"HTTP 500: RuntimeError: the environment crashed" + row, errors["agent_error"])
    assert re.fullmatch(rf"no answer within {timeout_s:g} s" + row, errors["timeout"])
    # Only the two good rollouts of each group train; the timed-out one's recorded call does not.
    assert record["groups"] == {"total": 2, "dropped": 0}
    assert record["update"]["applied"] is True and record["update"]["sequences"] <= 8
    assert record["time_s"]["rollout"] < timeout_s + 2.0
    assert summary.adapter_version == 1


def test_later_passes_are_clipped_against_the_batch_old_policy(tiny_model_dir: Path, tmp_path: Path) -> None:
    # Two passes per batch with the sampler/learner correction: the old policy is the learner's
    # logprobs taken once before the first pass, so the first pass's ratio is exactly 1 and the
    # second pass (after a large step) leaves the band; against its own logprobs it never would.
    fields = {
        "max_steps": 1,
        "num_iterations": 2,
        "vllm_importance_sampling_correction": True,
        "learning_rate": 0.3,
        "eval_on_start": False,
        "eval_on_end": False,
    }
    with serving(app) as agent_url:
        config = load_config(write_run_files(tmp_path, tiny_model_dir, agent_url, **fields))
        train(config)
    (record,) = [json.loads(line) for line in (config.output_dir / "metrics.jsonl").read_text().splitlines()]
    update = record["update"]
    assert update["applied"] is True
    assert update["ratio_mean"] == 1.0 and update["clip_fraction"] == 0.0
    assert update["clip_fraction_last"] > 0.0
    assert update["is_ratio_max"] >= update["is_ratio_mean"] > 0.0
    assert 0.0 <= update["is_capped_fraction"] <= 1.0 and update["is_weight_mean"] > 0.0
