"""Checkpoints: complete or absent, the newest K kept, a learner and RNGs restored exactly."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from trainer.algo.sequences import TrainingSequence
from trainer.config import TrainConfig
from trainer.learner.checkpoint import (
    DataPosition,
    RunState,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from trainer.learner.learner import Learner


def _learner(model_dir: Path) -> Learner:
    return Learner(model_dir, TrainConfig(learning_rate=1e-2, lr_scheduler_type="linear", loss_type="grpo"))


def _batch(seed: int) -> list[TrainingSequence]:
    rng = random.Random(seed)
    sequences = []
    for index, advantage in enumerate((1.0, -1.0)):
        ids = [rng.randrange(200) for _ in range(12)]
        mask = [0] * 5 + [1] * 7
        sequences.append(
            TrainingSequence(
                rollout_id=f"r{index}",
                token_ids=ids,
                loss_mask=mask,
                behavior_logprobs=[-5.0 * m for m in mask],
                advantage=advantage,
            )
        )
    return sequences


def _state(step: int) -> RunState:
    return RunState(
        step=step,
        adapter_version=step,
        position=DataPosition(epoch=1, order=[2, 0, 1], index=step % 3),
        history=[{"step": s, "reward_mean": s / 10} for s in range(1, step + 1)],
        evaluations=[{"step": 0, "success_rate": 0.25}],
        mlflow_run_id="abc",
    )


def test_resumed_learner_continues_exactly(tiny_model_dir: Path, tmp_path: Path) -> None:
    learner = _learner(tiny_model_dir)
    learner.train_step(_batch(0))
    random.seed(7)
    torch.manual_seed(7)
    path = save_checkpoint(tmp_path, _state(1), learner, keep=2)
    expected_python, expected_torch = random.random(), torch.rand(3)
    learner.train_step(_batch(1))

    fresh = _learner(tiny_model_dir)
    loaded = load_checkpoint(path, fresh)
    assert loaded.state == _state(1)
    assert (random.random(), torch.equal(torch.rand(3), expected_torch)) == (expected_python, True)
    fresh.train_step(_batch(1))
    a, b = learner.adapter_state(), fresh.adapter_state()
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert fresh.scheduler.get_last_lr() == learner.scheduler.get_last_lr()


def test_keeps_the_newest_k_and_ignores_partial_writes(tiny_model_dir: Path, tmp_path: Path) -> None:
    learner = _learner(tiny_model_dir)
    for step in range(1, 5):
        save_checkpoint(tmp_path, _state(step), learner, keep=2)
    assert [path.name for path in list_checkpoints(tmp_path)] == ["step-000003", "step-000004"]
    # What a kill during a write leaves: a temporary directory, and a step dir without its state file.
    (tmp_path / ".tmp-step-000005-x" / "adapter").mkdir(parents=True)
    (tmp_path / "step-000006").mkdir()
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == "step-000004"
    assert latest_checkpoint(tmp_path / "missing") is None
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        load_checkpoint(tmp_path / "step-000006", learner)
    with pytest.raises(ValueError, match="keep"):
        save_checkpoint(tmp_path, _state(7), learner, keep=0)


def test_state_saved_on_another_gpu_resumes_on_the_learners_device(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A checkpoint written by a learner on cuda:3 (its optimizer state tagged with that device), resumed
    # by a process without that GPU: torch.load would rebuild every tensor on cuda:3.
    learner = _learner(tiny_model_dir)
    learner.train_step(_batch(0))
    with monkeypatch.context() as patched:
        patched.setattr(torch.serialization, "location_tag", lambda storage: "cuda:3")
        path = save_checkpoint(tmp_path, _state(1), learner, keep=1)
    learner.train_step(_batch(1))

    fresh = _learner(tiny_model_dir)
    load_checkpoint(path, fresh)
    states = fresh.optimizer.state.values()
    moments = [value for state in states for value in state.values() if torch.is_tensor(value)]
    assert moments and {value.device for value in moments} == {fresh.device}
    fresh.train_step(_batch(1))
    a, b = learner.adapter_state(), fresh.adapter_state()
    assert all(torch.equal(a[name], b[name]) for name in a)
