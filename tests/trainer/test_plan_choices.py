"""`rft plan` counts what runs (vLLM's quantized weights, its KV cache with sliding windows) and chooses
the settings that make a config fit (trainer.scale.choices), the same for `rft train`."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from handlers.cli import main as rft
from trainer.config import load_config
from trainer.engine import local_engine
from trainer.scale.choices import preflight, resolve
from trainer.scale.learner_memory import update_extras
from trainer.scale.memory import GB, ModelShape
from trainer.scale.placement import Gpu, Node
from trainer.scale.plan import PlanError, render, shape_for
from trainer.scale.vllm_memory import vllm_need, weight_bytes

CONFIGS = Path(__file__).parent / "model_configs"
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


def _config_file(tmp_path: Path, model: str, config_json: dict | None = None, **fields: object) -> Path:
    model_dir = tmp_path / model
    model_dir.mkdir(exist_ok=True)
    if config_json is None:
        shutil.copy(CONFIGS / f"{model}.json", model_dir / "config.json")
    else:
        (model_dir / "config.json").write_text(json.dumps(config_json))
    path = tmp_path / f"{model}.yaml"
    path.write_text(yaml.safe_dump({"model": str(model_dir), "engine": "vllm", **fields}))
    return path


def _node(count: int, memory_gb: float) -> Node:
    return Node([Gpu(index, int(memory_gb * GB)) for index in range(count)], present=True)


def test_gpt_oss_20b_fits_one_80_gb_gpu_with_vllm_serving_mxfp4(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config_file(
        tmp_path,
        "gpt-oss-20b",
        placement={"num_gpus": 1, "gpu_memory_gb": 80},
        lora={"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "target_parameters": EXPERTS},
    )
    assert rft(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    weights = re.search(r"vLLM weights \(mxfp4, 4\.25 bits, the rest bfloat16\)\s+([\d.]+) GB", out)
    assert weights and 12 < float(weights.group(1)) < 16, out
    assert "peak" in out and "DOES NOT FIT" not in out
    chosen = [line for line in out.splitlines() if line.startswith("chosen: ")]
    assert any(line.startswith("chosen: vllm.gpu_memory_utilization: 0.") for line in chosen), out
    assert any("vllm.enable_sleep_mode: true" in line for line in chosen), out
    assert rft(["plan", str(path), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["fits"] and planned["placement"]["vllm_dtype"] == "bfloat16"
    assert [line.removeprefix("chosen: ") for line in chosen] == planned["choices"]


def test_llama_70b_on_8_gpus_shards_the_learner_over_gpus_of_its_own(tmp_path: Path) -> None:
    config = load_config(
        _config_file(tmp_path, "llama-3.3-70b", placement={"num_gpus": 8, "gpu_memory_gb": 80})
    )
    resolved = resolve(config, shape_for(config.model), _node(8, 80))
    plan, placement = resolved.plan, resolved.plan.placement
    assert plan.fits and plan.shards == 4
    assert placement.learner_devices == ("cuda:4", "cuda:5", "cuda:6", "cuda:7")
    assert placement.vllm_devices == [0, 1, 2, 3] and placement.vllm_tensor_parallel == 4
    assert (resolved.config.learner.processes, resolved.config.learner.shard) == (4, "fsdp")
    learner = next(device for device in plan.devices if device.device == "cuda:4")
    shard = next(item for item in learner.items if "FSDP2 shard" in item.label)
    assert shard.bytes == plan.shape.parameters() * 2 // 4
    assert plan.work is not None and all(
        gpu.sampling != "idle" or gpu.update != "idle" for gpu in plan.work.gpus
    )
    assert any("sharded with FSDP2 over cuda:4, cuda:5, cuda:6, cuda:7" in line for line in plan.choices)


def test_a_users_setting_wins_over_the_plans_choice(tmp_path: Path) -> None:
    path = _config_file(
        tmp_path,
        "qwen2.5-7b",
        placement={"num_gpus": 1, "gpu_memory_gb": 80},
        vllm={"gpu_memory_utilization": 0.4},
        learner={"gradient_checkpointing": False},
    )
    config = load_config(path)
    resolved = resolve(config, shape_for(config.model), _node(1, 80))
    assert resolved.config.vllm.gpu_memory_utilization == 0.4
    assert resolved.config.learner.gradient_checkpointing is False
    unset = load_config(path, ["learner.gradient_checkpointing=true"])
    derived = resolve(
        unset.model_copy(update={"vllm": type(unset.vllm)()}), shape_for(config.model), _node(1, 80)
    )
    assert derived.config.vllm.gpu_memory_utilization != 0.9
    assert "gpu_memory_utilization" not in derived.config.vllm.model_fields_set  # chosen, not set


def test_vllm_follows_the_learners_dtype_or_the_differing_pair_is_refused(tmp_path: Path) -> None:
    fp16 = {**json.loads((CONFIGS / "qwen2.5-7b.json").read_text()), "torch_dtype": "float16"}
    path = _config_file(tmp_path, "qwen2.5-7b", fp16, placement={"num_gpus": 2, "gpu_memory_gb": 80})
    config = load_config(path)
    resolved = resolve(config, shape_for(config.model), _node(2, 80))
    assert resolved.config.vllm.dtype == "bfloat16" and resolved.plan.serving_dtype == "bfloat16"
    assert any(line.startswith("vllm.dtype: bfloat16, the learner's dtype") for line in resolved.plan.choices)
    stated = "dtypes: the learner trains in bfloat16, vLLM serves in bfloat16 (the checkpoint's own: float16)"
    assert stated in render(resolved.plan)
    both = load_config(path, ["vllm.dtype=float16", "learner.dtype=bfloat16"])
    with pytest.raises(PlanError, match="vllm.dtype is float16 but learner.dtype is bfloat16"):
        resolve(both, shape_for(config.model), _node(2, 80))


def test_vllm_weights_follow_the_quantization_and_sliding_layers_hold_their_window() -> None:
    config = json.loads((CONFIGS / "gpt-oss-20b.json").read_text())
    shape = ModelShape.from_config(config)
    plain = ModelShape.from_config(
        {key: value for key, value in config.items() if key != "quantization_config"}
    )
    # The experts at 4.25 bits, attention, router, embeddings and head in bf16.
    experts = 24 * 32 * 3 * 2880 * 2880
    assert weight_bytes(plain, 2) - weight_bytes(shape, 2) == pytest.approx(experts * (2 - 4.25 / 8), abs=1e4)
    assert weight_bytes(shape, 2) < 16 * GB
    per_layer = 2 * 8 * 64 * 2  # k and v, 8 heads of 64, bf16
    assert shape.kv_bytes(8192, 2) == 12 * per_layer * 8192 + 12 * per_layer * 128


def test_a_block_wise_training_attention_counts_one_layers_block_scores_not_t_by_t() -> None:
    config = json.loads((CONFIGS / "gpt-oss-20b.json").read_text())
    eager = ModelShape.from_config(config, eager_attention=True)
    blocks = ModelShape.from_config(config, attention_block=128)
    tokens, heads = 8192, 64
    assert blocks.attention_block_bytes(tokens) == 4 * tokens * heads * 128 * 4  # 1.07 GB at 8k tokens
    labels = [label for label, _ in update_extras(blocks, tokens, 16, ["q_proj"], [], 2, True)]
    assert labels == ["attention's working scores (one layer, blocks of 128 queries, float32)"]
    eager_extras = dict(update_extras(eager, tokens, 16, ["q_proj"], [], 2, True))
    assert eager_extras["eager attention scores ([rows, 64 heads, T, T] per layer)"] > 20 * GB


def test_rft_train_applies_the_plans_choices_down_to_vllms_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _config_file(tmp_path, "llama-3-8b", vllm={"python": sys.executable})
    config = load_config(path)
    monkeypatch.setattr("trainer.scale.choices.detect_gpus", lambda: [Gpu(0, 80 * 10**9, "H100")])
    resolved, placement = preflight(config, config.model)
    planned = resolve(config, shape_for(config.model), _node(1, 80))
    assert resolved.model_dump() == planned.config.model_dump()  # one function for both commands
    assert resolved.vllm.gpu_memory_utilization != config.vllm.gpu_memory_utilization
    command = local_engine(resolved, Path(config.model), placement).command(8000)  # type: ignore[attr-defined]
    assert command[command.index("--gpu-memory-utilization") + 1] == str(resolved.vllm.gpu_memory_utilization)
    assert ("--enable-sleep-mode" in command) == resolved.vllm.enable_sleep_mode


def test_where_only_a_shorter_context_fits_the_refusal_suggests_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Gemma 4 31B on one 141 GB GPU: the learner's and vLLM's bf16 weights, and vLLM must hold one
    # sequence of the model's own 262,144 tokens (21 GB in its 10 global layers).
    path = _config_file(tmp_path, "gemma-4-31b", placement={"num_gpus": 1, "gpu_memory_gb": 141})
    assert rft(["plan", str(path)]) == 1
    captured = capsys.readouterr()
    assert "it fits with vllm.max_model_len=32768" in captured.err
    assert "tried: learner.gradient_checkpointing: true" in captured.out
    assert rft(["plan", str(path), "vllm.max_model_len=32768"]) == 0


def test_a_config_that_fits_as_it_is_comes_back_unchanged_and_resolving_twice_changes_nothing(
    tmp_path: Path,
) -> None:
    cpu = load_config(_config_file(tmp_path, "smollm2-135m", learner={"device": "cpu"}, engine="hf"))
    assert resolve(cpu, shape_for(cpu.model), Node([], present=False)).config is cpu
    config = load_config(
        _config_file(tmp_path, "gpt-oss-20b", placement={"num_gpus": 1, "gpu_memory_gb": 80})
    )
    once = resolve(config, shape_for(config.model), _node(1, 80))
    twice = resolve(once.config, shape_for(config.model), _node(1, 80))
    assert twice.config.model_dump() == once.config.model_dump() and twice.plan.fits


@pytest.mark.parametrize(
    ("quantization_config", "bits"),
    [
        ({"quant_method": "mxfp4"}, 4.25),
        ({"quant_method": "fp8"}, 8.0),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128}, 4.25),
        ({"quant_method": "awq", "bits": 4, "group_size": 64}, 4.5),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, 4.5),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, 4.5),
        ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 8}}}}, 8.0),
        ({"quant_method": "something-new"}, 16.0),  # unknown: counted unquantized, an upper bound
    ],
)
def test_each_quantization_method_is_counted_at_its_bits(quantization_config: dict, bits: float) -> None:
    from trainer.scale.quantization import Quantization

    found = Quantization.from_config({"quantization_config": quantization_config})
    assert found is not None and found.bits == bits
    assert found.keeps("lm_head") and found.keeps("model.embed_tokens")
    assert not found.keeps("model.layers.3.mlp.experts")


def test_gpt_oss_with_its_block_wise_training_attention_keeps_8192_tokens_and_vllms_kv_cache(
    tmp_path: Path,
) -> None:
    """What the plan chooses once gpt-oss's family trains with rftkit's chunked attention (issue 49
    item 2): no [T, T] scores, so the micro-batch keeps its 8192 tokens; sleep mode and checkpointing
    are chosen before vLLM's KV cache is cut below what the run's rollouts fill."""
    config = load_config(
        _config_file(
            tmp_path,
            "gpt-oss-20b",
            placement={"num_gpus": 1, "gpu_memory_gb": 80},
            lora={"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "target_parameters": EXPERTS},
        )
    )
    shape = dataclasses.replace(shape_for(config.model), eager_attention=False, attention_block=128)
    resolved = resolve(config, shape, _node(1, 80))
    assert resolved.plan.fits and resolved.config.max_tokens_per_microbatch == 8192
    assert resolved.config.vllm.enable_sleep_mode and resolved.config.learner.gradient_checkpointing
    (device,) = resolved.plan.devices
    cache = next(item for item in device.items if item.label.startswith("vLLM KV cache"))
    assert cache.bytes >= vllm_need(resolved.config, shape, 1).kv_cache
