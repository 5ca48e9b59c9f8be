"""Pictures on a real local Ray cluster: a replica of the tiny Qwen2-VL (hf engine) serves image calls
behind the gateway, sampling what the engine samples in one process, and two learner workers train
on the images shipped with each batch, scoring them as the sampler did; the sequences the one-process
learner cannot score stay out here too.

One cluster for the module (starting Ray costs seconds), one replica, two learner workers (gloo).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import torch

from policy_server import PolicyServer, ServerThread
from policy_server.engines.hf import HFEngine
from policy_server.engines.ray.engine import RayEngine
from policy_server.trace import RolloutTrace
from tests.vision_helpers import picture_episode
from trainer.algo.sequences import build_sequences
from trainer.config import TrainConfig, validate_config
from trainer.learner.distributed import RayLearner
from trainer.scale.ray_cluster import ray_engine, start_local_cluster

pytestmark = pytest.mark.slow  # starts Ray

JOB = "arn:aws:sagemaker:us-west-2:123456789012:training-job/ray-vision"
RED, BLUE, GREEN = (200, 0, 0), (0, 0, 200), (0, 160, 0)


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    start_local_cluster(4, log_to_driver=False)  # one replica and two learner workers
    yield
    ray.shutdown()


def _serve(engine: RayEngine | HFEngine) -> tuple[PolicyServer, ServerThread]:
    server = PolicyServer(engine)
    thread = ServerThread(server).start()
    server.open_job(JOB, max_tokens=5, auto_open_rollouts=True)
    return server, thread


@pytest.fixture(scope="module")
def served(cluster: None, tiny_vision_dir: Path) -> Iterator[tuple[PolicyServer, ServerThread, RayEngine]]:
    config = validate_config(
        {"model": str(tiny_vision_dir), "train_file": "unused.jsonl", "ray": {"inference_replicas": 1}}
    )
    engine = ray_engine(config, tiny_vision_dir)
    assert isinstance(engine, RayEngine)
    server, thread = _serve(engine)
    yield server, thread, engine
    thread.stop()


def _episodes(server: PolicyServer, thread: ServerThread, rollouts: dict[str, list]) -> list[RolloutTrace]:
    for rollout, colors in rollouts.items():
        picture_episode(thread, JOB, rollout, colors)
    return [server.take_trace(JOB, rollout) for rollout in rollouts]


def test_a_replica_serves_image_calls_as_the_engine_does_in_one_process(
    served: tuple[PolicyServer, ServerThread, RayEngine], tiny_vision_dir: Path
) -> None:
    server, thread, engine = served
    image_token = json.loads((tiny_vision_dir / "config.json").read_text())["image_token_id"]
    assert engine.supports_images and engine.image_token_id == image_token
    (trace,) = _episodes(server, thread, {"replica": [RED, BLUE, GREEN]})
    # Every call's images were located in the prompt the replica returned: 1, 2, then 3 pictures.
    assert [len(call.images) for call in trace.calls] == [1, 2, 3]
    assert all(call.prompt_token_ids[ref.start] == image_token for call in trace.calls for ref in call.images)

    local_server, local_thread = _serve(HFEngine(tiny_vision_dir))
    try:
        (local,) = _episodes(local_server, local_thread, {"replica": [RED, BLUE, GREEN]})
    finally:
        local_thread.stop()
    # The same seeds give the same tokens and logprobs to the bit: batch-invariant kernels in both.
    for ours, theirs in zip(trace.calls, local.calls, strict=True):
        assert ours.prompt_token_ids == theirs.prompt_token_ids
        assert ours.completion_token_ids == theirs.completion_token_ids
        assert ours.completion_logprobs == theirs.completion_logprobs
        assert ours.images == theirs.images
    server.release_trace(trace)


def test_learner_workers_score_and_train_on_the_images_shipped_with_the_batch(
    served: tuple[PolicyServer, ServerThread, RayEngine], tiny_vision_dir: Path
) -> None:
    server, thread, engine = served
    traces = _episodes(server, thread, {"a": [RED, BLUE, BLUE], "b": [RED, GREEN, RED]})
    sequences = [sequence for trace in traces for sequence in build_sequences(trace)]
    assert [len(sequence.images) for sequence in sequences] == [3, 3]
    config = TrainConfig.model_validate(
        {
            "learning_rate": 5e-2,
            "max_steps": 4,
            "loss_type": "grpo",
            "learner": {"device": "cpu", "dtype": "float32"},
            "max_tokens_per_microbatch": 1,  # a micro-batch per sequence: each worker scores one
            "ray": {"learner_workers": 2},
        }
    )
    learner = RayLearner(tiny_vision_dir, config, image_store=server.image_store)
    try:
        assert learner.image_token_id == engine.image_token_id
        # The workers rebuild each picture's pixels from the shipped bytes: the sampler's logprobs.
        for sequence, logprobs in zip(sequences, learner.old_logprobs(sequences), strict=True):
            mask = torch.tensor(sequence.loss_mask, dtype=torch.bool)
            torch.testing.assert_close(
                logprobs[mask], torch.tensor(sequence.behavior_logprobs)[mask], atol=1e-3, rtol=0
            )
        # A sampled placeholder keeps its sequence out, as in one process.
        stray = dataclasses.replace(
            sequences[0], token_ids=[*sequences[0].token_ids[:-1], engine.image_token_id]
        )
        assert learner.scorable([*sequences, stray]) == sequences
        sequences[0].advantage, sequences[1].advantage = 1.0, -1.0
        before = learner.adapter_state()
        result = learner.train_step(sequences, seed=0)
        assert not result.skipped and result.metrics["micro_batches"] == 2
        after = learner.adapter_state()
        assert any(not torch.equal(after[name], value) for name, value in before.items())
    finally:
        learner.close()
        for trace in traces:
            server.release_trace(trace)
    assert len(server.image_store) == 0
