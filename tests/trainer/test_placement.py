"""Placement on one node: which GPUs vLLM and the learner get, in which dtypes, and vLLM's command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from policy_server.engines.vllm import VLLMEngine
from trainer.config import TrainConfig
from trainer.scale.placement import Gpu, Node, PlacementError, cuda_visible_devices, node_for, place
from trainer.session import build_engine

GB = 10**9


def _node(count: int, memory_gb: float = 80) -> Node:
    return Node([Gpu(index, int(memory_gb * GB)) for index in range(count)], present=True)


def _config(**fields: object) -> TrainConfig:
    return TrainConfig.model_validate(fields)


def test_two_gpus_give_vllm_the_first_and_the_learner_the_second() -> None:
    placement = place(_config(engine="vllm"), _node(2))
    assert placement.vllm_devices == [0] and placement.learner_device == "cuda:1"
    assert placement.learner_dtype == "bfloat16" and placement.shared_gpus == []


def test_one_gpu_is_shared() -> None:
    placement = place(_config(engine="vllm", vllm={"gpu_memory_utilization": 0.4}), _node(1))
    assert placement.vllm_devices == [0] and placement.learner_device == "cuda:0"
    assert placement.shared_gpus == [0]


def test_no_gpu_means_cpu_and_float32() -> None:
    placement = place(_config(), _node(0))
    assert (placement.learner_device, placement.learner_dtype) == ("cpu", "float32")
    assert (placement.engine_device, placement.engine_dtype) == ("cpu", "float32")


def test_hf_engine_follows_the_learner_unless_told() -> None:
    assert place(_config(), _node(2)).engine_device == "cuda:0"
    told = place(_config(hf={"device": "cuda:1", "dtype": "float32"}), _node(2))
    assert (told.engine_device, told.engine_dtype, told.learner_device) == ("cuda:1", "float32", "cuda:0")


def test_placements_the_node_cannot_hold_are_refused() -> None:
    with pytest.raises(PlacementError, match="lower vllm.tensor_parallel_size"):
        place(_config(engine="vllm", vllm={"tensor_parallel_size": 2}), _node(1))
    with pytest.raises(PlacementError, match="GPU 3"):
        place(_config(learner={"device": "cuda:3"}), _node(2))
    with pytest.raises(ValueError, match="exactly tensor_parallel_size"):
        _config(engine="vllm", vllm={"devices": [0, 1, 2], "tensor_parallel_size": 2})


def test_declared_gpus_win_and_named_gpus_are_planned_for() -> None:
    declared = node_for(_config(placement={"num_gpus": 2, "gpu_memory_gb": 16}), [])
    assert [gpu.memory_bytes for gpu in declared.gpus] == [16 * GB, 16 * GB] and not declared.present
    named = node_for(_config(learner={"device": "cuda:1"}), [])
    assert len(named.gpus) == 2 and named.gpus[0].memory_bytes is None


def test_cuda_visible_devices_maps_through_the_parents_own() -> None:
    assert cuda_visible_devices([0, 1], inherited="") == "0,1"
    assert cuda_visible_devices([1], inherited="4,5") == "5"
    with pytest.raises(PlacementError):
        cuda_visible_devices([2], inherited="4,5")


def test_vllm_gets_its_gpus_and_first_class_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    config = _config(
        engine="vllm",
        vllm={
            "python": "/usr/bin/env",
            "devices": [2, 3],
            "tensor_parallel_size": 2,
            "gpu_memory_utilization": 0.45,
            "max_model_len": 4096,
            "enable_sleep_mode": True,
        },
    )
    # A model directory as far as choosing vLLM's parsers reads one (its config.json's family).
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    engine = build_engine(config, tmp_path, place(config, _node(4)))
    assert isinstance(engine, VLLMEngine)
    command = engine.command(8000)
    for flag, value in [
        ("--tensor-parallel-size", "2"),
        ("--gpu-memory-utilization", "0.45"),
        ("--max-model-len", "4096"),
    ]:
        assert command[command.index(flag) + 1] == value
    assert "--enable-sleep-mode" in command
    assert engine.command_env() == {
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
        "CUDA_VISIBLE_DEVICES": "2,3",
        "VLLM_SERVER_DEV_MODE": "1",
    }


def test_learner_processes_get_a_gpu_each_and_vllm_the_others() -> None:
    own = place(_config(engine="vllm", learner={"processes": 4}), _node(8))
    assert own.learner_devices == ("cuda:4", "cuda:5", "cuda:6", "cuda:7") and own.vllm_devices == [
        0,
        1,
        2,
        3,
    ]
    assert own.learner_gpus == [4, 5, 6, 7] and own.shared_gpus == []
    # As many processes as GPUs: vLLM shares every one of them.
    every = place(_config(engine="vllm", learner={"processes": 8}), _node(8))
    assert every.learner_gpus == list(range(8)) and every.shared_gpus == list(range(8))
    named = place(_config(engine="vllm", learner={"device": "cuda:2", "processes": 2}), _node(8))
    assert named.learner_process_devices == ("cuda:2", "cuda:3")
    cpu = place(_config(learner={"device": "cpu", "processes": 2}), Node([], present=False))
    assert cpu.learner_process_devices == ("cpu", "cpu")
    assert place(_config(engine="vllm"), _node(8)).learner_process_devices == ("cuda:7",)
    with pytest.raises(PlacementError, match="learner.processes is 4 but the node has 2 GPU"):
        place(_config(engine="vllm", learner={"processes": 4}), _node(2))
