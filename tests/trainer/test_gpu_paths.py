"""The CUDA paths' bugs (issue 25), each checked on the CPU: device strings, config refusals, what
crosses to the Ray driver, defaults resolved by device, the memory planner's LoRA term, the vLLM
engine's close after a failed start, the RNG a step saves, the checkpointing fallback, the warm
start's device and dtype, and the host syncs of a micro-batch's loss."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from policy_server.image_store import ImageStore
from trainer.config import ConfigError, TrainConfig, validate_config

CONFIGS = Path(__file__).parent / "model_configs"
BASE = {"train_file": "train.jsonl"}


# --- Ray learner workers: a device with an index -------------------------------------------------


def test_a_ray_learner_worker_gets_a_cuda_device_with_an_index() -> None:
    from torch.cuda._utils import _get_device_index

    from trainer.learner.distributed import worker_device

    # torch.cuda.set_device refuses a bare "cuda" (this is its check, no GPU needed).
    with pytest.raises(ValueError, match="specified index"):
        _get_device_index(torch.device("cuda"))
    for placed in ("cuda", "cuda:0", "cuda:3"):
        assert worker_device(placed) == "cuda:0"  # Ray's CUDA_VISIBLE_DEVICES: its own GPU is 0
        assert _get_device_index(torch.device(worker_device(placed))) == 0
    assert worker_device("cpu") == "cpu"


# --- vLLM sleep mode: what the config refuses ------------------------------------------------------


@pytest.mark.parametrize(
    ("vllm", "extra", "message"),
    [
        ({"enable_sleep_mode": True, "sleep_level": 2}, {}, "vllm.sleep_level 2: vLLM drops the weights"),
        ({"enable_sleep_mode": True}, {"max_off_policy_steps": 1}, "unset enable_sleep_mode or set max_off"),
    ],
)
def test_sleep_mode_refusals(vllm: dict[str, Any], extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate_config({**BASE, "engine": "vllm", "vllm": {"max_loras": 4, **vllm}, **extra})


def test_sleep_mode_at_level_1_on_policy_is_accepted() -> None:
    config = validate_config({**BASE, "engine": "vllm", "vllm": {"enable_sleep_mode": True}})
    assert config.vllm.sleep_level == 1
    # Without sleep mode, level 2 is never used: nothing to refuse.
    assert validate_config({**BASE, "vllm": {"sleep_level": 2}}).vllm.sleep_level == 2


# --- what a learner worker returns to the Ray driver ------------------------------------------------


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it lives on cuda:0; ``.cpu()`` gives a plain CPU tensor, as a CUDA
    tensor's does. Stands in for a learner's CUDA tensors on a machine without a GPU."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda:0")

    def cpu(self, *args: Any, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        return self.as_subclass(torch.Tensor).clone()


def _on_cuda(values: list[float]) -> torch.Tensor:
    return torch.tensor(values).as_subclass(_OnCuda)


class _FakeLearner:
    def __init__(self, images: ImageStore) -> None:
        self.images = images

    def adapter_state(self) -> dict[str, torch.Tensor]:
        return {"a": _on_cuda([1.0, 2.0])}

    def training_state(self) -> dict[str, Any]:
        state = {0: {"step": _on_cuda([3.0]), "exp_avg": _on_cuda([0.5])}}
        return {"optimizer": {"state": state, "param_groups": [{"lr": 0.1}]}, "steps_done": 2}

    def shard_old_logprobs(self, sequences: list[Any]) -> dict[int, torch.Tensor]:
        return {0: _on_cuda([-1.0, -2.0])}


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [tensor for item in value.values() for tensor in _tensors(item)]
    if isinstance(value, list | tuple):
        return [tensor for item in value for tensor in _tensors(item)]
    return []


def test_tensors_a_learner_worker_returns_are_on_the_cpu(tmp_path: Path) -> None:
    from trainer.learner.batch_images import ShippedBatch
    from trainer.learner.worker import LearnerWorker

    worker = LearnerWorker.__new__(LearnerWorker)  # its learner only: no model, no Ray
    worker.learner = _FakeLearner(ImageStore(tmp_path / "images"))  # type: ignore[assignment]
    shipped = ShippedBatch(sequences=[], images=[])
    returned = [worker.adapter_state(), worker.training_state(), worker.shard_old_logprobs(shipped)]
    tensors = [tensor for value in returned for tensor in _tensors(value)]
    assert len(tensors) == 4
    assert all(type(tensor) is torch.Tensor and tensor.device.type == "cpu" for tensor in tensors)
    assert returned[1]["steps_done"] == 2 and returned[1]["optimizer"]["param_groups"] == [{"lr": 0.1}]
    assert torch.equal(returned[0]["a"], torch.tensor([1.0, 2.0]))


# --- hf.batch_invariant: on for the CPU, off on CUDA unless set --------------------------------------


def test_batch_invariance_defaults_by_device(tmp_path: Path) -> None:
    from policy_server.engines.hf import HFEngine, default_batch_invariant

    assert TrainConfig.model_validate(BASE).hf.batch_invariant is None  # resolved by the engine's device
    assert default_batch_invariant("cpu") and not default_batch_invariant("cuda:1")
    assert HFEngine(tmp_path, device="cpu").batch_invariant is True
    assert HFEngine(tmp_path, device="cuda").batch_invariant is False  # no CUDA needed: not loaded yet
    assert HFEngine(tmp_path, device="cuda:0", batch_invariant=True).batch_invariant is True
    assert HFEngine(tmp_path, device="cpu", batch_invariant=False).batch_invariant is False


# --- the memory planner: LoRA's saved inputs -----------------------------------------------------------


def test_lora_activations_match_a_hand_count() -> None:
    from trainer.scale.memory import ModelShape

    shape = ModelShape.from_config(json.loads((CONFIGS / "llama-3-8b.json").read_text()))
    # Llama-3-8B: hidden 4096, 32 layers, intermediate 14336. The inputs of one layer's adapted
    # modules: q, k, v, gate, up take the 4096-wide hidden state, o the 4096-wide attention output,
    # down the 14336-wide MLP product: 38,912 features, each kept as a float32 copy (peft casts the
    # bf16 input to the adapter's dtype), plus lora_A's output, r = 16 floats per module.
    per_token_layer = 38_912 * 4 + 7 * 16 * 4
    assert shape.lora_activation_bytes(8192, 16, "all-linear", 2, checkpointing=False) == (
        8192 * 32 * per_token_layer
    )
    # With checkpointing only the layer being recomputed keeps them.
    assert (
        shape.lora_activation_bytes(8192, 16, "all-linear", 2, checkpointing=True) == 8192 * per_token_layer
    )
    # q and v only: 2 x 4096 input features.
    assert shape.lora_activation_bytes(1, 8, ["q_proj", "v_proj"], 2, False) == 32 * (
        2 * 4096 * 4 + 2 * 8 * 4
    )
    # A float32 model keeps the input itself (counted in the layer's activations) unless dropout
    # makes a new one, with its 1-byte mask.
    assert shape.lora_activation_bytes(1, 16, ["q_proj"], 4, False) == 32 * 16 * 4
    assert shape.lora_activation_bytes(1, 16, ["q_proj"], 4, False, dropout=True) == 32 * (4096 * 5 + 64)


def test_the_plan_counts_lora_activations_in_the_update() -> None:
    from trainer.scale.memory import ModelShape
    from trainer.scale.placement import Gpu, Node
    from trainer.scale.plan import make_plan

    shape = ModelShape.from_config(json.loads((CONFIGS / "llama-3-8b.json").read_text()))
    config = validate_config(
        {
            **BASE,
            "learner": {"device": "cuda:0"},
            "hf": {"device": "cuda:0"},
            "max_tokens_per_microbatch": 8192,
        }
    )
    plan = make_plan(config, shape, Node([Gpu(0, int(141e9), "H200")], present=False))
    items = {item.label.split(" (")[0]: item for device in plan.devices for item in device.items}
    lora = items["LoRA inputs kept for backward"]
    assert lora.phase == "update"
    assert lora.bytes == shape.lora_activation_bytes(8192, config.lora.r, "all-linear", 2, False)


# --- the vLLM engine: close() after a failed start ---------------------------------------------------


def test_vllm_engine_closes_after_a_failed_start(tmp_path: Path) -> None:
    from policy_server.engines import VLLMEngine, VLLMEngineError

    engine = VLLMEngine(tmp_path, python=str(tmp_path / "no-such-python"))

    async def start_then_close() -> None:
        with pytest.raises(VLLMEngineError, match="does not exist"):
            await engine.start()
        await engine.close()  # raised AttributeError (_chat_session), hiding the start's error

    asyncio.run(start_then_close())


# --- the learner: RNG saved, checkpointing fallback ---------------------------------------------------


def test_a_step_saves_every_cuda_generator_it_reseeds(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.learner.model import rng_devices

    assert rng_devices(torch.device("cpu")) == []  # no CUDA state touched on the CPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    # torch.manual_seed reseeds every CUDA device, so every one is saved, not only the learner's.
    assert rng_devices(torch.device("cuda:1")) == [0, 1]


class _OldTransformersModel:
    """A model of a transformers without ``activation_checkpointing_enable`` (the older name only)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict[str, Any]) -> None:
        self.calls.append(gradient_checkpointing_kwargs)


class _NewTransformersModel:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs: dict[str, Any]) -> None:
        self.calls.append(activation_checkpointing_kwargs)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict[str, Any]) -> None:
        raise AssertionError("the deprecated alias is not used when the new name exists")


def test_checkpointing_falls_back_to_the_older_method_name() -> None:
    from trainer.learner.model import enable_checkpointing

    for model in (_OldTransformersModel(), _NewTransformersModel()):
        enable_checkpointing(model)
        assert model.calls == [{"use_reentrant": False}]


# --- the SFT warm start: the learner's device and dtype --------------------------------------------


def test_warm_start_device_and_dtype_resolve_as_the_learners(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.sft.common import sft_device_and_dtype

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert sft_device_and_dtype() == (torch.device("cpu"), torch.float32)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert sft_device_and_dtype() == (torch.device("cuda:0"), torch.bfloat16)
    assert sft_device_and_dtype("cuda") == (torch.device("cuda:0"), torch.bfloat16)
    assert sft_device_and_dtype("cuda:1", "float32") == (torch.device("cuda:1"), torch.float32)


def test_warm_start_runs_in_the_dtype_it_is_given(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from agents.maze.demonstrations import maze_demonstrations
    from trainer.sft.text import run_sft

    loaded: list[Any] = []
    original = AutoModelForCausalLM.from_pretrained

    def from_pretrained(*args: Any, **kwargs: Any) -> Any:
        loaded.append(kwargs.get("dtype"))
        return original(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", from_pretrained)
    result = run_sft(
        tiny_model_dir,
        maze_demonstrations(2, seed=0),
        tmp_path / "adapter",
        steps=1,
        batch_size=2,
        target_modules=["q_proj", "v_proj"],
        device="cpu",
        dtype="bfloat16",
    )
    assert loaded == [torch.bfloat16]
    assert len(result.losses) == 1 and result.losses[0] == result.losses[0]  # finite, not NaN
    weights = load_file(str(result.adapter_dir / "adapter_model.safetensors"))
    assert weights and all(tensor.dtype == torch.float32 for tensor in weights.values())  # LoRA stays fp32


# --- host syncs: one per micro-batch's metrics ----------------------------------------------------------


# --- MLflow off: what the offline device check runs with -----------------------------------------------


def test_metrics_without_mlflow_write_the_jsonl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from trainer.ops.metrics import NO_MLFLOW, MetricsLogger

    for name in ("mlflow", "mlflow.tracking", "mlflow.entities"):
        monkeypatch.setitem(sys.modules, name, None)  # importing it raises ImportError
    logger = MetricsLogger(tmp_path, tracking_uri=NO_MLFLOW)
    seen: list[int] = []
    logger.sinks.append(lambda step, record: seen.append(step))
    logger.log_params({"lr": 1.0})
    logger.log_step(1, {"loss": 0.5})
    logger.log_artifact(tmp_path)
    logger.close()
    assert logger.mlflow_run_id is None and seen == [1]
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["loss"] == 0.5
    assert validate_config({**BASE, "mlflow_tracking_uri": "none"}).mlflow_uri == NO_MLFLOW
