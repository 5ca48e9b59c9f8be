"""Placement fills the node: vLLM's data-parallel replicas and tensor-parallel size chosen from the
model's size and described nodes (1, 2, 4, 8 GPUs of 24/80/141 GB), what each GPU does per phase,
the sentences for idle GPUs, and the vLLM command a run would start."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from handlers.cli import main as rft
from policy_server.engines.vllm import VLLMEngine
from trainer.config import TrainConfig
from trainer.scale.memory import ModelShape
from trainer.scale.phases import IDLE, node_work
from trainer.scale.placement import Gpu, Node, PlacementError, place
from trainer.scale.plan import make_plan
from trainer.session import build_engine

CONFIGS = Path(__file__).parent / "model_configs"
GB = 10**9


def _shape(model: str) -> ModelShape:
    return ModelShape.from_config(json.loads((CONFIGS / f"{model}.json").read_text()))


def _node(count: int, memory_gb: float) -> Node:
    return Node([Gpu(index, int(memory_gb * GB)) for index in range(count)], present=True)


def _config(**fields: object) -> TrainConfig:
    return TrainConfig.model_validate({"engine": "vllm", **fields})


# (model, GPUs, GB each) -> (vLLM's GPUs, tensor parallel, data parallel, learner)
LAYOUTS = [
    ("smollm2-135m", 1, 24, ([0], 1, 1, "cuda:0")),
    ("smollm2-135m", 2, 24, ([0], 1, 1, "cuda:1")),
    ("smollm2-135m", 4, 80, ([0, 1, 2], 1, 3, "cuda:3")),
    ("smollm2-135m", 8, 141, ([0, 1, 2, 3, 4, 5, 6], 1, 7, "cuda:7")),
    ("llama-3-8b", 2, 80, ([0], 1, 1, "cuda:1")),
    ("llama-3-8b", 4, 141, ([0, 1, 2], 1, 3, "cuda:3")),
    ("llama-3-8b", 8, 80, ([0, 1, 2, 3, 4, 5, 6], 1, 7, "cuda:7")),
    # vLLM serves the MXFP4 checkpoint (13.7 GB of weights): one 24 GB GPU holds a replica.
    ("gpt-oss-20b", 2, 24, ([0], 1, 1, "cuda:1")),
    ("gpt-oss-20b", 8, 24, ([0, 1, 2, 3, 4, 5, 6], 1, 7, "cuda:7")),
    ("gpt-oss-20b", 8, 141, ([0, 1, 2, 3, 4, 5, 6], 1, 7, "cuda:7")),
]


@pytest.mark.parametrize(("model", "count", "memory_gb", "expected"), LAYOUTS)
def test_described_nodes_get_the_pinned_layout(
    model: str, count: int, memory_gb: float, expected: tuple[list[int], int, int, str]
) -> None:
    placement = place(_config(), _node(count, memory_gb), _shape(model))
    got = (
        placement.vllm_devices,
        placement.vllm_tensor_parallel,
        placement.vllm_data_parallel,
        placement.learner_device,
    )
    assert got == expected


@pytest.mark.parametrize("count", [1, 2, 4, 8])
@pytest.mark.parametrize("memory_gb", [24, 80, 141])
def test_by_default_every_gpu_works_in_some_phase(count: int, memory_gb: float) -> None:
    node = _node(count, memory_gb)
    plan = make_plan(_config(learner={"gradient_checkpointing": True}), _shape("llama-3-8b"), node)
    assert plan.work is not None
    assert all(gpu.sampling != IDLE or gpu.update != IDLE for gpu in plan.work.gpus)
    assert not any("nothing in either phase" in note for note in plan.work.notes)


def test_rft_plan_prints_the_8_gpu_layout_per_phase(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "llama").mkdir()
    shutil.copy(CONFIGS / "llama-3-8b.json", tmp_path / "llama" / "config.json")
    path = tmp_path / "run.yaml"
    fields = {"model": str(tmp_path / "llama"), "engine": "vllm", "learner": {"gradient_checkpointing": True}}
    path.write_text(yaml.safe_dump({**fields, "placement": {"num_gpus": 8, "gpu_memory_gb": 80}}))
    assert rft(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "vLLM: 7 replica(s) x 1 GPU(s)" in out and "learner on cuda:7" in out
    lines = [line.split() for line in out.splitlines() if line.startswith("  GPU ")]
    assert [line[1] for line in lines] == [f"{index}:" for index in range(8)]
    assert lines[0][3:6] == ["vLLM", "replica", "1"] and lines[7][3:7] == [
        "idle",
        "update:",
        "learner",
        "idle",
    ]
    assert "not built yet" not in out  # the learner's processes are (learner.processes)
    assert rft(["plan", str(path), "--json"]) == 0
    phases = json.loads(capsys.readouterr().out)["phases"]
    assert [gpu["update"] for gpu in phases["gpus"]] == [IDLE] * 7 + ["learner"]


def test_explicit_settings_win() -> None:
    shape, node = _shape("smollm2-135m"), _node(8, 80)
    told = place(_config(vllm={"devices": [2, 3], "tensor_parallel_size": 2}), node, shape)
    assert (told.vllm_devices, told.vllm_tensor_parallel, told.vllm_data_parallel) == ([2, 3], 2, 1)
    assert told.learner_device == "cuda:0"
    two = place(_config(vllm={"data_parallel_size": 2}), node, shape)
    assert (two.vllm_devices, two.vllm_data_parallel, two.learner_device) == ([0, 1], 2, "cuda:2")
    wide = place(_config(vllm={"tensor_parallel_size": 2}), node, shape)
    assert (wide.vllm_devices, wide.vllm_data_parallel, wide.learner_device) == (
        [0, 1, 2, 3, 4, 5],
        3,
        "cuda:6",
    )
    named = place(_config(learner={"device": "cuda:0"}), node, shape)
    assert (named.vllm_devices, named.learner_device) == ([1, 2, 3, 4, 5, 6, 7], "cuda:0")
    cpu = place(_config(learner={"device": "cpu"}), node, shape)
    assert (cpu.vllm_data_parallel, cpu.learner_device) == (8, "cpu")


def test_a_layout_that_leaves_gpus_idle_says_so_and_what_would_use_them() -> None:
    shape = _shape("smollm2-135m")
    hf = make_plan(TrainConfig.model_validate({"engine": "hf"}), shape, _node(4, 80)).work
    assert hf is not None
    assert [gpu.idle for gpu in hf.gpus[1:]] == [1.0, 1.0, 1.0]
    assert "GPU 1, 2, 3 do nothing in either phase: engine: vllm puts data-parallel" in hf.notes[0]
    pinned = make_plan(_config(vllm={"devices": [0]}), shape, _node(4, 80)).work
    assert pinned is not None and "unset vllm.devices" in pinned.notes[0]
    leftover = make_plan(_config(), _shape("qwen3.6-27b"), _node(8, 24)).work
    assert leftover is not None and leftover.notes[0].startswith("GPU 5, 6, 7 do nothing")


def test_idle_shares_follow_the_loop() -> None:
    shape, node = _shape("smollm2-135m"), _node(2, 80)
    sync = node_work(_config(), place(_config(), node, shape), node)
    assert sync is not None and not sync.overlapped
    # Sampling 2N per token on one vLLM GPU, the update 4N on the learner's: a third and two thirds.
    assert sync.gpus[0].idle == pytest.approx(2 / 3) and sync.gpus[1].idle == pytest.approx(1 / 3)
    overlapped = _config(max_off_policy_steps=1, vllm={"max_loras": 3})
    both = node_work(overlapped, place(overlapped, node, shape), node)
    assert both is not None and both.overlapped
    assert both.gpus[0].idle == pytest.approx(1 / 2) and both.gpus[1].idle == pytest.approx(0)
    shared = node_work(_config(), place(_config(), _node(1, 80), shape), _node(1, 80))
    assert shared is not None and shared.gpus[0].idle == 0 and shared.notes == []


def test_the_vllm_command_starts_the_planned_replicas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    shutil.copy(CONFIGS / "smollm2-135m.json", tmp_path / "config.json")
    config = _config(vllm={"python": "/usr/bin/env"})
    engine = build_engine(config, tmp_path, place(config, _node(8, 80), _shape("smollm2-135m")))
    assert isinstance(engine, VLLMEngine)
    command = engine.command(8000)
    assert command[command.index("--data-parallel-size") + 1] == "7"
    assert command[command.index("--tensor-parallel-size") + 1] == "1"
    assert engine.command_env()["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6"


def test_a_cpu_run_starts_vllm_as_before(tmp_path: Path) -> None:
    shutil.copy(CONFIGS / "smollm2-135m.json", tmp_path / "config.json")
    config = _config(vllm={"python": "/usr/bin/env"})
    placement = place(config, Node([], present=False), _shape("smollm2-135m"))
    assert (placement.vllm_devices, placement.vllm_tensor_parallel, placement.vllm_data_parallel) == (
        [],
        1,
        1,
    )
    assert node_work(config, placement, Node([], present=False)) is None
    engine = build_engine(config, tmp_path, placement)
    assert isinstance(engine, VLLMEngine)
    command = engine.command(8000)
    assert "--data-parallel-size" not in command
    assert command[command.index("--tensor-parallel-size") + 1] == "1"


def test_data_parallel_vllm_on_ray_is_refused_with_a_sentence() -> None:
    config = _config(ray={}, vllm={"data_parallel_size": 2})
    with pytest.raises(PlacementError, match="unset vllm.data_parallel_size"):
        place(config, _node(4, 80), _shape("smollm2-135m"))
