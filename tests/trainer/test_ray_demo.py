"""``rft demo --ray``: the maze demo served by two inference replicas and trained by two learner
workers on a local Ray cluster, every stage, smoke-sized.

The learning of ``rft demo --ray --quick`` is measured in the README (15.6% -> 35.9%); here the quick
plan runs two GRPO steps and evaluates on 8 mazes, so the suite pays for Ray's actors, not for 16 steps.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from agents.maze.demo.demo import run_demo
from agents.maze.demo.plans import QUICK

# The quick plan's warm start, so both steps have groups with reward variance and the workers train
# (after 80 warm-start steps instead of 150, neither step had one).
SMOKE = dataclasses.replace(QUICK, grpo_steps=2, warmup_steps=0, eval_rows=8, eval_generations=1)


@pytest.mark.slow
def test_demo_on_ray_runs_every_stage_with_both_replicas_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir = tmp_path / "demo"
    results = run_demo(run_dir, plan=SMOKE, ray=True)
    out = capsys.readouterr().out
    assert "=== 5/5 results ===" in out and "success rate" in out and "stopped early" in out
    assert results["ray"] == {"address": "local", "inference_replicas": 2, "learner_workers": 2}
    assert results["before"]["scored"] == results["after"]["scored"] == SMOKE.eval_rows
    records = [json.loads(line) for line in (run_dir / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == list(range(1, SMOKE.grpo_steps + 1))
    assert all(record["rollouts"]["failed"] == 0 for record in records)
    assert results["after"]["adapter_version"] > results["before"]["adapter_version"]
    # Both replicas served calls (new rollouts go to the one with fewer calls out), none died.
    replicas = records[-1]["replicas"]
    assert replicas["live"] == [0, 1] and min(replicas["calls"]) > 0 and replicas["deaths"] == 0
    assert "inference replicas on Ray: calls per replica" in out
    log = (run_dir / "grpo" / "train.log").read_text()
    assert "2 learner workers joined" in log
