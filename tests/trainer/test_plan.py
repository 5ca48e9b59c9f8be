"""`rft plan`: memory per device from config.json alone, refusals that say what to change."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from handlers.cli import main as rft
from trainer.config import load_config
from trainer.scale.choices import check, preflight
from trainer.scale.placement import RAY_REPLICAS, Gpu, Node
from trainer.scale.plan import PlanError, make_plan, render, shape_for

CONFIGS = Path(__file__).parent / "model_configs"
NO_GPU_HERE = not torch.cuda.is_available()


def _run_config(tmp_path: Path, model: str, **fields: object) -> Path:
    """A training config for a model directory that holds only the published config.json."""
    model_dir = tmp_path / model
    model_dir.mkdir(exist_ok=True)
    shutil.copy(CONFIGS / f"{model}.json", model_dir / "config.json")
    path = tmp_path / f"{model}.yaml"
    path.write_text(yaml.safe_dump({"model": model, **fields}))
    return path


def _plan_cli(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    code = rft(["plan", str(path), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.skipif(not NO_GPU_HERE, reason="checks the message of a machine without a GPU")
def test_a_cuda_bf16_config_is_planned_on_a_machine_without_a_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _run_config(
        tmp_path, "smollm2-135m", engine="vllm", learner={"device": "cuda", "dtype": "bfloat16"}
    )
    code, out, _ = _plan_cli(path, capsys)
    assert code == 0, out
    assert "no GPU is present on this machine" in out
    assert "learner on cuda:0 (bfloat16)" in out and "sharing GPU 0" in out
    # 134.5 M parameters in bf16: 0.27 GB of weights.
    assert re.search(r"learner weights \(0\.13 B params, bfloat16\)\s+0\.27 GB", out), out


def test_an_8b_model_on_a_16_gb_gpu_is_refused_with_a_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _run_config(
        tmp_path,
        "llama-3-8b",
        engine="vllm",
        learner={"device": "cuda", "dtype": "bfloat16"},
        placement={"num_gpus": 1, "gpu_memory_gb": 16},
    )
    code, out, err = _plan_cli(path, capsys)
    assert code == 1 and "DOES NOT FIT" in out
    assert err.startswith("refused: cuda:0 needs about")
    assert "has 16.0 GB" in err and "weights alone take 16.1 GB in bfloat16" in err
    assert "use a GPU with more memory" in err


def test_the_suggested_change_really_fits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The user set every lever the plan would choose itself: the refusal suggests changing one of them.
    path = _run_config(
        tmp_path,
        "qwen2.5-7b",
        engine="vllm",
        vllm={"gpu_memory_utilization": 0.5, "max_model_len": 8192, "enable_sleep_mode": False},
        learner={"gradient_checkpointing": False},
        max_tokens_per_microbatch=8192,
        placement={"num_gpus": 1, "gpu_memory_gb": 80},
    )
    code, _, err = _plan_cli(path, capsys)
    assert code == 1
    suggestion = re.search(r"it fits with (\S+)=(\S+) \(then the largest peak", err)
    assert suggestion, err
    assert suggestion.group(1) == "learner.gradient_checkpointing"
    code, out, _ = _plan_cli(path, capsys, f"{suggestion.group(1)}={suggestion.group(2)}")
    assert code == 0 and "checkpointing on" in out and "DOES NOT FIT" not in out


def test_vllm_share_too_small_for_its_weights(tmp_path: Path) -> None:
    config = load_config(
        # Checkpointing: 8192 tokens of Llama-3-8B's activations, LoRA's float32 inputs with them,
        # need more than the learner's 80 GB without it.
        _run_config(
            tmp_path,
            "llama-3-8b",
            engine="vllm",
            vllm={"gpu_memory_utilization": 0.1},
            learner={"gradient_checkpointing": True},
        )
    )
    node = Node([Gpu(0, 80 * 10**9), Gpu(1, 80 * 10**9)], present=True)
    with pytest.raises(PlanError, match="vLLM's share of cuda:0 \\(8.0 GB\\) cannot hold"):
        check(config, shape_for(config.model), node)
    roomy = config.model_copy(update={"vllm": config.vllm.model_copy(update={"gpu_memory_utilization": 0.5})})
    plan = check(roomy, shape_for(config.model), node)
    assert [device.device for device in plan.devices] == ["cuda:1", "cuda:0"]


def test_sleep_mode_moves_vllm_out_of_the_update_peak(tmp_path: Path) -> None:
    path = _run_config(tmp_path, "qwen2.5-7b", engine="vllm", vllm={"gpu_memory_utilization": 0.5})
    node = Node([Gpu(0, 80 * 10**9)], present=True)
    awake, asleep = (
        make_plan(
            load_config(path, [f"vllm.enable_sleep_mode={flag}"]), shape_for(tmp_path / "qwen2.5-7b"), node
        )
        for flag in ("false", "true")
    )
    (device_awake,), (device_asleep,) = awake.devices, asleep.devices
    # Asleep, the update phase holds only vLLM's CUDA context (1 GB) instead of its 40 GB share.
    assert device_awake.phase_total("update") - device_asleep.phase_total("update") == 39 * 10**9
    assert device_asleep.phase_total("rollouts") == device_awake.phase_total("rollouts")


def test_json_output_and_hub_ids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _run_config(tmp_path, "gpt-oss-20b", learner={"device": "cpu"})
    code, out, _ = _plan_cli(path, capsys, "--json")
    plan = json.loads(out)
    assert plan["parameters"] == pytest.approx(20.9e9, rel=0.02)
    assert plan["placement"]["learner"] == "cpu" and plan["devices"][0]["device"] == "cpu"
    hub = tmp_path / "hub.yaml"
    hub.write_text("model: Qwen/Qwen3-8B\n")
    code, _, err = _plan_cli(hub, capsys)
    assert code == 2 and "is not a local directory" in err


@pytest.mark.skipif(not NO_GPU_HERE, reason="checks the refusal of a machine without a GPU")
def test_train_preflight_refuses_cuda_without_a_gpu(tmp_path: Path) -> None:
    config = load_config(_run_config(tmp_path, "smollm2-135m", learner={"device": "cuda"}))
    with pytest.raises(PlanError, match="torch sees no CUDA device here: set learner.device: cpu"):
        preflight(config, config.model)


def test_a_free_gpu_is_suggested_before_anything_else(tmp_path: Path) -> None:
    # vLLM told to take GPU 0, which the learner shares, while GPU 1 sits free.
    path = _run_config(
        tmp_path,
        "qwen2.5-7b",
        engine="vllm",
        learner={"device": "cuda", "gradient_checkpointing": False},
        vllm={"devices": [0], "enable_sleep_mode": False},
    )
    # 4096 tokens per micro-batch: the learner alone fits a free 80 GB GPU (8192 need checkpointing).
    overrides = ["vllm.gpu_memory_utilization=0.5", "placement.num_gpus=2", "max_tokens_per_microbatch=4096"]
    config = load_config(path, overrides)
    node = Node([Gpu(0, 80 * 10**9), Gpu(1, 80 * 10**9)], present=True)
    with pytest.raises(PlanError, match='it fits with learner.device="cuda:1"'):
        check(config, shape_for(config.model), node)


def test_with_ray_the_node_plans_the_learner_alone(tmp_path: Path) -> None:
    """Replica actors hold GPUs of their own: vLLM is not planned onto the learner's GPU, and the
    advice names the learner's levers (it tried vLLM's sleep mode, which Ray configs refuse)."""
    path = _run_config(
        tmp_path,
        "llama-3-8b",
        engine="vllm",
        ray={"address": "auto", "inference_replicas": 2},
        learner={"gradient_checkpointing": False},
        max_tokens_per_microbatch=8192,
    )
    config = load_config(path)
    node = Node([Gpu(0, 48 * 10**9)], present=True)
    with pytest.raises(PlanError, match="it fits with learner.gradient_checkpointing=true"):
        check(config, shape_for(config.model), node)
    fitted = make_plan(
        load_config(path, ["learner.gradient_checkpointing=true"]), shape_for(config.model), node
    )
    assert fitted.fits
    assert fitted.placement.engine_device == RAY_REPLICAS and fitted.placement.vllm_devices == []
    (device,) = fitted.devices
    assert device.device == "cuda:0" and all("vLLM" not in item.label for item in device.items)
    # Sharded, each of the two learner workers holds half the base and of the LoRA state.
    sharded = make_plan(
        load_config(
            path, ["learner.gradient_checkpointing=true", "learner.shard=fsdp", "ray.learner_workers=2"]
        ),
        shape_for(config.model),
        node,
    )
    assert sharded.shards == 2 and sharded.devices[0].peak[0] < device.peak[0]
    where = "learner on cuda:0 of each of 2 Ray learner workers (each holds a 1/2 FSDP2 shard)"
    assert where in render(sharded)
    assert any("a 1/2 FSDP2 shard" in item.label for item in sharded.devices[0].items)
