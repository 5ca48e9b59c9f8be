"""Ray learner workers' devices come from the cluster's nodes, not from where the driver runs."""

from __future__ import annotations

from typing import Any

from trainer.config import TrainConfig
from trainer.learner.worker_devices import learner_node_gpus, worker_devices

HEAD = {"CPU": 8.0, "driver": 1.0}  # a GPU-less head node, where the driver runs
GPU_NODE = {"CPU": 32.0, "GPU": 8.0, "learner": 1.0}
INFERENCE_NODE = {"CPU": 32.0, "GPU": 8.0, "inference": 1.0}


def _config(workers: int = 2, **fields: Any) -> TrainConfig:
    ray = {"learner_workers": workers, **fields.pop("ray", {})}
    return TrainConfig.model_validate({"ray": ray, **fields})


def test_a_driver_without_a_gpu_still_gets_gpu_workers() -> None:
    chosen = worker_devices(_config(), [HEAD, GPU_NODE])
    assert (chosen.gpus_each, chosen.device, chosen.dtype) == (1, "cuda", "bfloat16")
    assert (
        chosen.reason == "2 learner worker(s) on one GPU each in bfloat16: the cluster's nodes have 8 GPU(s)"
    )
    assert not chosen.short_of_gpus


def test_a_cluster_without_gpus_trains_on_cpus_in_float32() -> None:
    chosen = worker_devices(_config(), [HEAD])
    assert (chosen.gpus_each, chosen.device, chosen.dtype) == (0, "cpu", "float32")
    assert chosen.reason.endswith("the cluster's nodes have no GPU")


def test_only_the_learners_node_group_counts() -> None:
    pinned = _config(ray={"learner_resources": {"learner": 1}})
    assert learner_node_gpus([HEAD, GPU_NODE, INFERENCE_NODE], {"learner": 1}) == 8
    assert worker_devices(pinned, [HEAD, INFERENCE_NODE]).device == "cpu"
    chosen = worker_devices(pinned, [HEAD, INFERENCE_NODE, GPU_NODE])
    assert chosen.device == "cuda" and "nodes with learner have 8 GPU(s)" in chosen.reason


def test_the_users_settings_win() -> None:
    assert worker_devices(_config(learner={"device": "cpu"}), [GPU_NODE]).device == "cpu"
    told = worker_devices(_config(learner={"device": "cuda", "dtype": "float32"}), [GPU_NODE])
    assert (told.gpus_each, told.dtype) == (1, "float32")


def test_fewer_gpus_than_workers_says_what_to_change() -> None:
    chosen = worker_devices(_config(workers=4), [HEAD, {"CPU": 8.0, "GPU": 2.0}])
    assert chosen.device == "cuda" and chosen.short_of_gpus
    assert "lower ray.learner_workers, add GPU nodes, or set learner.device: cpu" in chosen.reason
