"""A hostile agent against `rft train`: every attack is refused, the run finishes, its numbers are the
benign run's (same seed, same numbers)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from agents.letters import main as letters
from agents.letters.run_files import serving, write_run_files
from tests.trainer.agent_apps import hostile
from trainer.config import load_config
from trainer.loop import train

RUN = {"max_steps": 2, "eval_file": None, "save_steps": 2, "policy_server": {"api_key": "agents-key"}}


def _numbers(run: Path) -> list[dict[str, object]]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [
        {
            "reward_mean": record["reward_mean"],
            "loss": record["update"].get("loss"),
            "failed": record["rollouts"]["failed"],
            "sampled": record["tokens"]["sample"],
        }
        for record in records
    ]


def test_a_hostile_agent_cannot_stop_or_change_a_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    results = {}
    for name, app in (("benign", letters.app), ("hostile", hostile.app)):
        with serving(app) as agent_url:
            config = load_config(write_run_files(tmp_path / name, tiny_model_dir, agent_url, **RUN))
            summary = train(config)
        assert summary.steps == 2
        weights = load_file(summary.adapter_dir / "adapter_model.safetensors")
        results[name] = (_numbers(config.output_dir), weights)

    # Every attack was tried by every rollout (2 steps x 8 rollouts) and refused with a 4xx.
    assert len(hostile.ATTEMPTS) == 2 * 8 * 9
    by_name: dict[str, set[int]] = {}
    for name, status in hostile.ATTEMPTS:
        by_name.setdefault(name, set()).add(status)
    assert all(by_name[name] == {403} for name in ("close-job", "take-trace", "load-adapter", "open-job"))
    assert by_name["call other rollout"] == {404} and by_name["reward other rollout"] == {404}
    assert by_name["call other job"] == {400} and by_name["reward other job"] == {400}
    assert by_name["client template"] == {400}

    benign_numbers, benign_weights = results["benign"]
    hostile_numbers, hostile_weights = results["hostile"]
    assert all(row["failed"] == 0 for row in hostile_numbers)
    # The hf engine is batch-invariant, so the hostile run's numbers are the benign run's to the last
    # bit: rewards, losses, sampled tokens and the adapter's weights.
    assert hostile_numbers == benign_numbers
    assert benign_weights.keys() == hostile_weights.keys()
    for key, tensor in benign_weights.items():
        assert torch.equal(hostile_weights[key], tensor), key


def test_a_taken_trace_or_a_closed_job_does_not_crash_the_session(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """What an agent did before the boundary existed (take its own trace, close the job), done here
    in process: the rollout fails with its cause and the session still closes cleanly."""
    from handlers.decorator import rft_app
    from policy_server.engines.hf import HFEngine
    from trainer.session import Session as _Session

    session: _Session | None = None

    def rollout(row: object, ctx: object) -> float:
        assert session is not None
        session.server.take_trace(session.job_arn, ctx.rollout_id)  # type: ignore[attr-defined]
        return 1.0

    with serving(rft_app(rollout)) as agent_url:
        config = load_config(write_run_files(tmp_path, tiny_model_dir, agent_url))
        session = _Session(config, HFEngine(tiny_model_dir))
        session.start()
        try:
            played = session.play([session.request({"question": "q"}, "r-1", 0, temperature=1.0, seed=1)])
            outcome = played[0].outcome
            assert outcome.status == "failed" and "trace could not be taken" in (outcome.error or "")
            session.server.close_job(session.job_arn)
        finally:
            session.close()  # the job is gone already: close() still finishes
