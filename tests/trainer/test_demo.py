"""``rft demo --quick``: every stage runs over loopback HTTP and the policy gets better at mazes.

``rft demo --ray`` gives the GRPO stage a ``ray`` section (two inference replicas, two learner workers
on a local cluster); ``rft train`` with such a section runs end to end on a real cluster in
``test_ray_replicas.py`` and ``test_ray_learner.py``, pictures in ``test_ray_vision.py``, and the demo
on Ray learns as in one process (docs/ray.md).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from agents.maze.demo.agent_process import serve_agent
from agents.maze.demo.demo import main
from agents.maze.demo.grpo_config import train_config
from agents.maze.demo.plans import QUICK
from trainer.config import TrainConfig
from trainer.evaluate.cli import main as eval_main

# The quick demo: 16 GRPO steps of 4 mazes x 8 rollouts, then 32 mazes x 2 rollouts sampled at
# temperature 1 with the same seeds before and after (a paired comparison). The hf engine is
# batch-invariant, so a run repeats exactly (tests/trainer/test_determinism.py): the lift is a
# number, and the issue asks for a real one.
QUICK_MIN_IMPROVEMENT_POINTS = 10.0


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """``rft demo --quick`` run once for the module: its directory and its console output."""
    run_dir = tmp_path_factory.mktemp("quick") / "demo"
    console = io.StringIO()
    with contextlib.redirect_stdout(console):
        assert main(["--quick", "--out", str(run_dir)]) == 0
    return run_dir, console.getvalue()


@pytest.mark.slow
def test_quick_demo_learns(
    quick_run: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir, out = quick_run
    assert "=== 5/5 results ===" in out and "success rate" in out and "stopped early" in out
    results = json.loads((run_dir / "results.json").read_text())
    before, after = results["before"], results["after"]
    assert before["scored"] == after["scored"] == 64
    assert results["improvement_points"] >= QUICK_MIN_IMPROVEMENT_POINTS, results
    walkers = results["baselines"]
    assert walkers["random"] < walkers["noisy"] < walkers["observation"] <= walkers["oracle"] == 1.0
    assert "of the gap to the best observation-only policy" in out
    assert after["adapter_version"] > before["adapter_version"], "GRPO applied no update"
    assert set(after["agent_metrics"]) == {"solved", "moves", "stopped"}
    # What the run leaves behind.
    assert (run_dir / "progress.png").stat().st_size > 0
    assert (run_dir / "adapter" / "adapter_config.json").is_file()
    assert (run_dir / "train.yaml").read_text().startswith("# The demo's GRPO run")
    assert (run_dir / "grpo" / "mlruns").is_dir()
    assert list((run_dir / "grpo").glob("*.jsonl"))
    assert json.loads((run_dir / "warm-start.json").read_text())["made_from"]["seed"] == 0
    # A second demo into the same directory is refused rather than mixed in.
    assert main(["--quick", "--out", str(run_dir)]) == 2
    capsys.readouterr()

    # `rft eval` on the demo's final adapter gives the demo's "after" number to the bit (the recipe in
    # docs/operations.md, with the agent on a free port instead of 8080).
    with serve_agent() as agent_url:
        evaluated = tmp_path / "eval"
        argv = [str(run_dir / "train.yaml"), "--adapter", str(run_dir / "adapter"), "--out", str(evaluated)]
        assert eval_main([*argv, "--set", f"agents=[{agent_url}]"]) == 0
    (adapter,) = json.loads((evaluated / "eval.json").read_text())["policies"]
    same = ("success_rate", "mean_reward", "scored", "failed", "agent_metrics")
    assert {key: adapter[key] for key in same} == {key: after[key] for key in same}


@pytest.mark.slow
def test_the_ray_flag_gives_the_grpo_stage_two_replicas_and_two_learner_workers_on_a_local_cluster(
    quick_run: tuple[Path, str], tmp_path: Path
) -> None:
    run_dir = quick_run[0]
    made = json.loads((run_dir / "warm-start.json").read_text())

    def config(ray: bool) -> TrainConfig:
        return train_config(
            QUICK,
            model_dir=run_dir / "model",
            init_adapter=run_dir / "sft-adapter",
            data_dir=run_dir / "data",
            output_dir=tmp_path / "grpo",
            agent_url="http://127.0.0.1:8080",
            engine="hf",
            target_modules=made["target_modules"],
            seed=0,
            ray=ray,
        )

    on_ray = config(ray=True).ray
    assert on_ray is not None and config(ray=False).ray is None
    assert (on_ray.address, on_ray.inference_replicas, on_ray.learner_workers) == ("local", 2, 2)
