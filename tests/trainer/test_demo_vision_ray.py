"""``rft demo --vision --ray --quick``: the visual maze served by two inference replicas and trained by
two learner workers on a local Ray cluster, with the plan of ``rft demo --vision --quick``; it learns
as that run does (the same lift asked), every evaluation episode's pictures served by a replica and
every step's pictures shipped to the workers with the batch. Its evaluations are the one-process
engine's to the bit: ``rft eval`` without Ray gives the warm start's and the final adapter's numbers.

Measured against the one-process run (docs/ray.md, pictures on Ray): the same evaluations and the same
rewards at every step; the two workers' update differs from one process's in the float noise (the
gradient summed in another order), which did not flip a sampled token in 12 steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.maze.demo.agent_process import serve_agent
from agents.maze.demo.demo import main
from agents.maze.demo.plans import RAY_SECTION, VISION_QUICK
from tests.trainer.test_demo_vision import VISION_QUICK_MIN_IMPROVEMENT_POINTS
from trainer.evaluate.cli import main as eval_main


@pytest.mark.slow
def test_quick_vision_demo_on_ray_runs_every_stage_and_learns(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir = tmp_path / "demo"
    assert main(["--vision", "--ray", "--quick", "--out", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "vision quick demo" in out and "=== 5/5 results ===" in out
    results = json.loads((run_dir / "results.json").read_text())
    assert results["ray"] == RAY_SECTION and results["plan"]["observation"] == "image"
    before, after = results["before"], results["after"]
    assert before["scored"] == after["scored"] == VISION_QUICK.eval_rows * VISION_QUICK.eval_generations
    assert results["improvement_points"] >= VISION_QUICK_MIN_IMPROVEMENT_POINTS, results
    records = [json.loads(line) for line in (run_dir / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == list(range(1, VISION_QUICK.grpo_steps + 1))
    assert all(record["rollouts"]["failed"] == 0 for record in records)
    # Both replicas served picture calls and none died; two workers trained every step.
    replicas = records[-1]["replicas"]
    assert replicas["live"] == [0, 1] and min(replicas["calls"]) > 0 and replicas["deaths"] == 0
    log = (run_dir / "grpo" / "train.log").read_text()
    assert "2 learner workers joined" in log
    assert after["adapter_version"] > before["adapter_version"]

    # The same adapters evaluated in one process (hf engine, no Ray): the numbers Ray served, to the bit.
    with serve_agent() as agent_url:
        evaluated = tmp_path / "eval"
        adapters = ["--adapter", str(run_dir / "sft-adapter"), "--adapter", str(run_dir / "adapter")]
        argv = [str(run_dir / "train.yaml"), *adapters, "--out", str(evaluated)]
        assert eval_main([*argv, "--set", f"agents=[{agent_url}]", "--set", "ray=null"]) == 0
    policies = json.loads((evaluated / "eval.json").read_text())["policies"]
    same = ("success_rate", "mean_reward", "scored", "failed", "agent_metrics")
    assert [{key: policy[key] for key in same} for policy in policies] == [
        {key: evaluation[key] for key in same} for evaluation in (before, after)
    ]
