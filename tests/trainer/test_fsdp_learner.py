"""The sharded learner: learner processes of this node (gloo on CPU) holding FSDP2 shards of the tiny
models train the adapter one unsharded learner trains, checkpoint their sharded optimizer state and
resume it on another number of processes, and name a rank that dies.

Every test starts its learner processes (a few seconds each, more on a loaded machine: the module
is marked slow); the numbers are compared with one :class:`Learner` in this process over the same
batches and seeds.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from agents.letters.main import app
from agents.letters.run_files import serving, write_run_files
from policy_server import PolicyServer, ServerThread
from policy_server.engines.hf import HFEngine
from policy_server.models.families import family
from tests.process_tree import descendants
from tests.vision_helpers import picture_episode
from trainer.algo.grpo import token_logprobs
from trainer.algo.sequences import TrainingSequence, build_sequences
from trainer.config import TrainConfig, load_config
from trainer.errors import TrainingError
from trainer.learner.checkpoint import RunState, load_checkpoint, save_checkpoint
from trainer.learner.learner import Learner
from trainer.learner.processes import ProcessLearner
from trainer.learner.rank_processes import LearnerProcessDied
from trainer.loop import train

# Adam turns a gradient's float rounding (sums in another order across ranks) into up to its whole
# step where the gradient is near zero: a small learning rate keeps that under the 1e-6 asked for,
# and three steps still move the adapter far more than that (checked below).
pytestmark = pytest.mark.slow

LEARNING_RATE = 2e-4
TOLERANCE = 1e-6


def _config(
    processes: int | None = None, shard: str = "off", timeout_s: float = 60, **fields: Any
) -> TrainConfig:
    # Dropout on: a micro-batch's mask must not depend on the rank that computes it. A small token
    # budget makes five micro-batches for six sequences: two ranks get three and two (a padding pass).
    learner: dict[str, Any] = {
        "device": "cpu",
        "dtype": "float32",
        "shard": shard,
        "collective_timeout_s": timeout_s,
    }
    if processes is not None:
        learner["processes"] = processes
    return TrainConfig.model_validate(
        {
            "learning_rate": LEARNING_RATE,
            "max_steps": 4,
            "lora": {"r": 4, "lora_alpha": 8, "lora_dropout": 0.1},
            "learner": learner,
            "max_tokens_per_microbatch": 24,
            **fields,
        }
    )


def _sequences(learner: Learner, count: int = 6) -> list[TrainingSequence]:
    """Random prompts and completions, two calls per episode, sampled by the initial policy."""
    rng = random.Random(0)
    vocab = learner.model.config.vocab_size
    sequences = []
    for index in range(count):
        prompt = [rng.randrange(vocab) for _ in range(4 + index)]
        completion = [rng.randrange(vocab) for _ in range(3 + index)]
        ids = prompt + completion
        with torch.no_grad():
            logprobs = token_logprobs(
                learner.model(input_ids=torch.tensor([ids])).logits, torch.tensor([ids])
            )
        mask = [0] * len(prompt) + [1] * len(completion)
        sequences.append(
            TrainingSequence(
                rollout_id=f"episode-{index // 2}",
                token_ids=ids,
                loss_mask=mask,
                behavior_logprobs=[
                    lp if m else 0.0 for lp, m in zip(logprobs[0].tolist(), mask, strict=True)
                ],
                advantage=[1.0, -0.5, 0.25, -1.0][index % 4],
                num_calls=1,
            )
        )
    return sequences


def _steps(
    learner: Learner | ProcessLearner, sequences: list[TrainingSequence], steps: range
) -> list[dict[str, float]]:
    metrics = []
    for step in steps:
        old = learner.old_logprobs(sequences)
        metrics.append(learner.train_step(sequences, seed=100 + step, old_logprobs=old).metrics)
    return metrics


def _difference(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> float:
    assert ours.keys() == theirs.keys()
    return max(float((theirs[name] - value).abs().max()) for name, value in ours.items())


def _same_steps(got: list[dict[str, float]], expected: list[dict[str, float]]) -> None:
    for ours, theirs in zip(got, expected, strict=True):
        assert ours["loss"] == pytest.approx(theirs["loss"], abs=1e-6)
        assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-5)
        assert (ours["completion_tokens"], ours["micro_batches"]) == (theirs["completion_tokens"], 5.0)


@pytest.fixture
def processes() -> Iterator[list[ProcessLearner]]:
    """The process learners a test starts, closed however it ends."""
    started: list[ProcessLearner] = []
    yield started
    for learner in started:
        learner.close()


@dataclass
class Trained:
    """One learner in this process, three steps on six sequences: what the processes must match."""

    sequences: list[TrainingSequence]
    start: dict[str, torch.Tensor]
    metrics: list[dict[str, float]]
    adapter: dict[str, torch.Tensor]
    learner: Learner


def _trained(model_dir: Path, beta: float) -> Trained:
    local = Learner(model_dir, _config(beta=beta))
    start = local.adapter_state()
    sequences = _sequences(local)
    metrics = _steps(local, sequences, range(3))
    return Trained(sequences, start, metrics, local.adapter_state(), local)


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path) -> Trained:
    return _trained(tiny_model_dir, beta=0.0)


def _matches(learner: ProcessLearner, got: list[dict[str, float]], expected: Trained) -> None:
    _same_steps(got, expected.metrics)
    difference = _difference(learner.adapter_state(), expected.adapter)
    assert difference <= TOLERANCE, f"the adapters differ by {difference}"
    assert _difference(expected.start, expected.adapter) > 100 * TOLERANCE  # the steps did train


def test_two_sharded_processes_train_the_adapter_of_one_learner_and_resume_on_one(
    tiny_model_dir: Path, tmp_path: Path, trained: Trained, processes: list[ProcessLearner]
) -> None:
    sequences = trained.sequences
    two = ProcessLearner(tiny_model_dir, _config(2, "fsdp"))
    processes.append(two)
    got = _steps(two, sequences, range(2))
    checkpoint = save_checkpoint(tmp_path, RunState(step=2), two, keep=1)
    got += _steps(two, sequences, range(2, 3))
    _matches(two, got, trained)
    # The checkpoint: each rank's shard of the LoRA weights and AdamW's moments, one adapter whole.
    shards = sorted(path.name for path in (checkpoint / "sharded").glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]
    assert (checkpoint / "adapter" / "adapter_model.safetensors").is_file()
    one = ProcessLearner(tiny_model_dir, _config(1, "fsdp"))  # a world of one: still sharded, FSDP2
    processes.append(one)
    assert load_checkpoint(checkpoint, one).state.step == 2
    resumed = _steps(one, sequences, range(2, 3))
    assert resumed[0]["learning_rate"] == got[2]["learning_rate"]  # the schedule resumed too
    _matches(one, got[:2] + resumed, trained)
    # An unsharded learner cannot read the shards: the sentence says which setting can.
    with pytest.raises(TrainingError, match=r"sharded over 2 learner process\(es\) \(learner.shard: fsdp\)"):
        load_checkpoint(checkpoint, trained.learner)


def test_two_unsharded_learner_processes_are_plain_data_parallel_and_a_hung_rank_is_named(
    tiny_model_dir: Path, trained: Trained, processes: list[ProcessLearner]
) -> None:
    # The timeout bounds how far one rank may run ahead of another: two ranks doing the same work on
    # the tiny model stay well within it on a loaded machine, and the hung rank's case waits it out.
    learner = ProcessLearner(tiny_model_dir, _config(2, "off", timeout_s=10))
    processes.append(learner)
    _matches(learner, _steps(learner, trained.sequences, range(3)), trained)
    # A rank that hangs: the other gives up in its collective after the timeout, and the step ends
    # naming the silent rank.
    hung = learner.processes[1]
    os.kill(hung.pid, signal.SIGSTOP)
    with pytest.raises(LearnerProcessDied) as failure:
        learner.train_step(trained.sequences, seed=0)
    assert failure.value.rank == 1
    assert str(failure.value).startswith(
        f"learner process 1 of 2 (pid {hung.pid}) stopped answering (the other ranks gave up waiting for it "
        "in a collective after learner.collective_timeout_s = 10 s) during train_step: the step cannot finish"
    )
    assert all(process.poll() is not None for process in learner.processes)


def test_sharded_processes_with_kl_match_one_learner_and_name_a_rank_killed_mid_step(
    tiny_model_dir: Path, processes: list[ProcessLearner]
) -> None:
    expected = _trained(tiny_model_dir, beta=0.04)
    learner = ProcessLearner(tiny_model_dir, _config(2, "fsdp", beta=0.04))
    processes.append(learner)
    got = _steps(learner, expected.sequences, range(3))
    _matches(learner, got, expected)
    assert got[-1]["kl"] > 0 and got[-1]["kl"] == pytest.approx(expected.metrics[-1]["kl"], rel=1e-4)

    victim = learner.processes[1]
    # Rank 1 frozen before the step: rank 0 starts it alone and waits in its first collective.
    os.kill(victim.pid, signal.SIGSTOP)
    failure: list[BaseException] = []

    def step() -> None:
        try:
            learner.train_step(expected.sequences, seed=0)
        except BaseException as error:
            failure.append(error)

    stepping = threading.Thread(target=step)
    stepping.start()
    os.kill(victim.pid, signal.SIGKILL)
    stepping.join(timeout=120)
    assert not stepping.is_alive()
    (error,) = failure
    assert isinstance(error, LearnerProcessDied) and error.rank == 1
    assert re.fullmatch(
        rf"learner process 1 of 2 \(pid {victim.pid}\) died \(killed by SIGKILL\) during train_step: the "
        r"step cannot finish, so the run stops; `rft train --resume` continues from the newest checkpoint",
        str(error),
    )
    assert all(process.poll() is not None for process in learner.processes)  # none left behind


JOB = "arn:aws:sagemaker:us-west-2:123456789012:training-job/fsdp-vision"
RED, BLUE, GREEN = (200, 0, 0), (0, 0, 200), (0, 160, 0)


@pytest.fixture(scope="module")
def qwen3_vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return family("qwen3_vl").build_tiny(tmp_path_factory.mktemp("qwen3-vl") / "model")


@pytest.fixture
def picture_sequences(qwen3_vl_dir: Path) -> Iterator[tuple[list[TrainingSequence], PolicyServer]]:
    """Two sampled episodes of the tiny Qwen3-VL, three pictures each, as training sequences."""
    server = PolicyServer(HFEngine(qwen3_vl_dir))
    thread = ServerThread(server).start()
    try:
        server.open_job(JOB, max_tokens=5, auto_open_rollouts=True)
        for rollout, colors in {"a": [RED, BLUE, BLUE], "b": [RED, GREEN, RED]}.items():
            picture_episode(thread, JOB, rollout, colors)
        traces = [server.take_trace(JOB, rollout) for rollout in ("a", "b")]
        sequences = [sequence for trace in traces for sequence in build_sequences(trace)]
        sequences[0].advantage, sequences[1].advantage = 1.0, -1.0
        yield sequences, server
    finally:
        thread.stop()


def test_two_sharded_processes_train_a_qwen3_vl_picture_batch_as_one_learner(
    qwen3_vl_dir: Path,
    picture_sequences: tuple[list[TrainingSequence], PolicyServer],
    processes: list[ProcessLearner],
) -> None:
    sequences, server = picture_sequences
    assert [len(sequence.images) for sequence in sequences] == [3, 3]
    # A micro-batch per sequence: each rank scores one, pictures on both ranks' passes. LoRA on the
    # vision tower, its mergers and DeepStack's too: their shards train as one learner's weights.
    lora = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.1, "adapt_vision": "all"}
    config = _config(loss_type="grpo", max_tokens_per_microbatch=1, lora=lora)
    local = Learner(qwen3_vl_dir, config, image_store=server.image_store)
    start = local.adapter_state()
    expected = _steps(local, sequences, range(2))
    sharded = config.model_copy(
        update={"learner": config.learner.model_copy(update={"processes": 2, "shard": "fsdp"})}
    )
    learner = ProcessLearner(qwen3_vl_dir, sharded, image_store=server.image_store)
    processes.append(learner)
    got = _steps(learner, sequences, range(2))
    for ours, theirs in zip(got, expected, strict=True):
        assert ours["loss"] == pytest.approx(theirs["loss"], abs=1e-6)
        assert ours["micro_batches"] == theirs["micro_batches"] == 2
    difference = _difference(learner.adapter_state(), local.adapter_state())
    assert difference <= TOLERANCE, f"the adapters differ by {difference}"
    assert _difference(start, local.adapter_state()) > 100 * TOLERANCE


def test_rft_train_with_sharded_learner_processes_checkpoints_and_resumes_on_one(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    sharded = {"processes": 2, "shard": "fsdp", "device": "cpu", "dtype": "float32"}
    with serving(app) as agent_url:
        path = write_run_files(
            tmp_path, tiny_model_dir, agent_url, eval_file=None, max_steps=2, learner=sharded
        )
        config = load_config(path)
        summary = train(config)
        assert summary.steps == 2
        checkpoint = config.output_dir / "checkpoints" / "step-000002"
        assert len(list((checkpoint / "sharded").glob("*.distcp"))) == 2
        # The learner processes end with the run.
        assert not descendants(os.getpid())
        # Resumed onto one sharded learner process, the run goes on from step 2's shards.
        one = config.model_copy(
            update={"max_steps": 3, "learner": config.learner.model_copy(update={"processes": 1})}
        )
        summary = train(one, resume=True)
    assert summary.steps == 3
    records = [json.loads(line) for line in (config.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [1, 2, 3]
    assert all(record["update"]["applied"] for record in records)
    assert (config.output_dir / "adapters" / "v3" / "adapter_model.safetensors").is_file()
