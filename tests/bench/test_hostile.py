"""bench/hostile.py on one round: every category answered, no 5xx, no admin route opened by the agents'
key, innocent rollouts unchanged (the bench's full run is in docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "hostile.py"


def test_one_round_of_hostile_input_breaks_nothing() -> None:
    spec = importlib.util.spec_from_file_location("hostile_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    hostile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hostile)
    result = hostile.run(repeat=1)
    assert set(result["by_category"]) == set(hostile.categories(0))
    assert result["server_5xx"] == 0 and result["admin_routes_opened"] == 0
    assert result["innocent_rollouts_changed"] == 0
    assert all(status < 500 for status in result["statuses"])
