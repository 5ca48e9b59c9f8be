"""``rft demo --ray --quick``: the quick maze demo served by two inference replicas on a local Ray cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.trainer.test_demo import QUICK_MIN_IMPROVEMENT_POINTS
from trainer.demo import main


@pytest.mark.slow
def test_quick_demo_on_ray_learns_with_both_replicas_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir = tmp_path / "demo"
    assert main(["--ray", "--quick", "--out", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "=== 5/5 results ===" in out and "success rate" in out and "stopped early" in out
    results = json.loads((run_dir / "results.json").read_text())
    assert results["ray"]["inference_replicas"] == 2
    assert results["before"]["scored"] == results["after"]["scored"] == 64
    assert results["improvement_points"] >= QUICK_MIN_IMPROVEMENT_POINTS, results
    records = [json.loads(line) for line in (run_dir / "grpo" / "metrics.jsonl").read_text().splitlines()]
    replicas = records[-1]["replicas"]
    # Both replicas served calls (new rollouts go to the one with fewer calls out), none died.
    assert replicas["live"] == [0, 1] and min(replicas["calls"]) > 0 and replicas["deaths"] == 0
    assert "inference replicas on Ray: calls per replica" in out
