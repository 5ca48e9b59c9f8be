"""The learner and the placement on a real CUDA device (marked ``gpu``: deselected without one;
``bench/device_check.sh`` runs them on the GPU machine).

The learner in bfloat16 with gradient checkpointing and chunked logprobs gives the gradients of a
float32 CPU learner on the same adapter and batch (to bf16's precision), on token sequences and on the
tiny VLM's picture episodes (pixels and M-RoPE positions rebuilt on the GPU); a step leaves the caller's
CUDA RNG as it was; the Ray worker's device string works with ``torch.cuda.set_device``; what a
worker returns is on the CPU; the placement sees the GPU and a child process sees the GPUs
``CUDA_VISIBLE_DEVICES`` gives it.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from policy_server import PolicyServer, ServerThread
from policy_server.engines.hf import HFEngine
from tests.vision_helpers import picture_episode
from trainer.algo.sequences import TrainingSequence, build_sequences, micro_batches_by_token_budget
from trainer.config import TrainConfig
from trainer.learner.learner import Learner
from trainer.learner.steps import StepTotals as _StepTotals
from trainer.scale.placement import Placement, cuda_visible_devices, detect_gpus, node_for, place

pytestmark = pytest.mark.gpu


def record(name: str, figures: dict[str, Any]) -> None:
    """Append a test's figures to $RFTKIT_GPU_FIGURES (JSON lines) when set: the device check's
    report carries them."""
    path = os.environ.get("RFTKIT_GPU_FIGURES")
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps({"test": name, **figures}) + "\n")


def _config(**fields: Any) -> TrainConfig:
    return TrainConfig.model_validate(
        {"learning_rate": 1e-2, "max_steps": 10, "loss_type": "grpo", "lora": {"r": 8}, **fields}
    )


def _placement(device: str, dtype: str) -> Placement:
    return Placement(
        learner_device=device, learner_dtype=dtype, engine_device=device, engine_dtype=dtype, vllm_devices=[]
    )


def _sequences(vocab: int, advantages: list[float], seed: int = 0) -> list[TrainingSequence]:
    """Random prompts and completions; behaviour logprobs near (not at) a policy's, so ratios vary."""
    rng = random.Random(seed)
    sequences = []
    for index, advantage in enumerate(advantages):
        prompt = [rng.randrange(vocab) for _ in range(8 + index)]
        completion = [rng.randrange(vocab) for _ in range(20 + 5 * index)]
        mask = [0] * len(prompt) + [1] * len(completion)
        behavior = [(-6.0 + rng.uniform(-0.5, 0.5)) if m else 0.0 for m in mask]
        sequences.append(
            TrainingSequence(
                rollout_id=f"r{index}",
                token_ids=prompt + completion,
                loss_mask=mask,
                behavior_logprobs=behavior,
                advantage=advantage,
                num_calls=1,
            )
        )
    return sequences


def _random_adapter(learner: Learner, seed: int) -> dict[str, torch.Tensor]:
    """Non-zero A and B (peft starts B at 0, where A gets no gradient), the same on any device."""
    generator = torch.Generator().manual_seed(seed)
    values = {}
    for name, parameter in learner.model.named_parameters():
        if parameter.requires_grad:
            values[name] = torch.randn(parameter.shape, generator=generator) * 0.05
    return values


def _gradients(learner: Learner, adapter: dict[str, torch.Tensor], sequences: list[TrainingSequence]) -> Any:
    with torch.no_grad():
        for name, parameter in learner.model.named_parameters():
            if name in adapter:
                parameter.copy_(adapter[name].to(parameter.device, parameter.dtype))
    learner.optimizer.zero_grad(set_to_none=True)
    micro = micro_batches_by_token_budget(sequences, learner.micro_batch_tokens)
    sums = learner._accumulate(micro, None, _StepTotals.of(sequences), seed=0)
    assert sums.finite
    grads = {
        name: parameter.grad.detach().float().cpu()
        for name, parameter in learner.model.named_parameters()
        if name in adapter
    }
    return grads, sums


def test_bf16_checkpointed_chunked_gradients_match_an_fp32_reference(tiny_model_dir: Path) -> None:
    fields = {
        "learner": {"gradient_checkpointing": True, "logits_chunk_size": 16},
        "max_tokens_per_microbatch": 96,  # several micro-batches
    }
    cuda = Learner(tiny_model_dir, _config(**fields), placement=_placement("cuda:0", "bfloat16"))
    reference = Learner(tiny_model_dir, _config(), placement=_placement("cpu", "float32"))
    assert cuda.device == torch.device("cuda:0") and cuda.model.get_base_model().dtype == torch.bfloat16
    assert cuda.model.get_base_model().is_gradient_checkpointing
    assert all(p.dtype == torch.float32 and p.is_cuda for p in cuda.trainable)  # LoRA stays fp32
    adapter = _random_adapter(reference, seed=1)
    sequences = _sequences(cuda.model.config.vocab_size, [1.0, -1.0, 0.5, -0.5, 2.0])
    got, sums = _gradients(cuda, adapter, sequences)
    want, _ = _gradients(reference, adapter, sequences)
    assert len(micro_batches_by_token_budget(sequences, cuda.micro_batch_tokens)) > 1
    flat_got = torch.cat([got[name].reshape(-1) for name in sorted(want)])
    flat_want = torch.cat([want[name].reshape(-1) for name in sorted(want)])
    cosine = torch.nn.functional.cosine_similarity(flat_got, flat_want, dim=0).item()
    relative = ((flat_got - flat_want).norm() / flat_want.norm()).item()
    record("learner_bf16_vs_fp32", {"gradient_cosine": cosine, "gradient_relative_error": relative})
    assert flat_want.norm() > 0
    assert cosine > 0.99 and relative < 0.1, (cosine, relative)


def picture_gradient_agreement(model_dir: Path, device: str, dtype: str) -> dict[str, float]:
    """Two picture episodes of the tiny VLM (sampled on the CPU), then the learner on ``device`` in
    ``dtype`` against a float32 CPU learner: the cosine and relative error of their LoRA gradients
    on the same adapter, and whether a step on ``device`` ran. The learner rebuilds pixels and M-RoPE
    positions from the server's image store."""
    job = "arn:aws:sagemaker:us-west-2:123456789012:training-job/cuda-vision"
    server = PolicyServer(HFEngine(model_dir))
    thread = ServerThread(server).start()
    server.open_job(job, max_tokens=5, auto_open_rollouts=True)
    try:
        red, blue, green = (200, 0, 0), (0, 0, 200), (0, 160, 0)
        picture_episode(thread, job, "a", [red, blue, blue])
        picture_episode(thread, job, "b", [red, green, red])
        traces = [server.take_trace(job, rollout) for rollout in ("a", "b")]
        sequences = [sequence for trace in traces for sequence in build_sequences(trace)]
        sequences[0].advantage, sequences[1].advantage = 1.0, -1.0
        store = server.image_store
        learner = Learner(model_dir, _config(), placement=_placement(device, dtype), image_store=store)
        reference = Learner(model_dir, _config(), placement=_placement("cpu", "float32"), image_store=store)
        adapter = _random_adapter(reference, seed=1)
        got, _ = _gradients(learner, adapter, sequences)
        want, _ = _gradients(reference, adapter, sequences)
        flat_got = torch.cat([got[name].reshape(-1) for name in sorted(want)])
        flat_want = torch.cat([want[name].reshape(-1) for name in sorted(want)])
        stepped = not learner.train_step(sequences, seed=0).skipped
        for trace in traces:
            server.release_trace(trace)
    finally:
        thread.stop()
    return {
        "images": float(sum(len(sequence.images) for sequence in sequences)),
        "reference_norm": flat_want.norm().item(),
        "gradient_cosine": torch.nn.functional.cosine_similarity(flat_got, flat_want, dim=0).item(),
        "gradient_relative_error": ((flat_got - flat_want).norm() / flat_want.norm()).item(),
        "stepped": float(stepped),
    }


def test_picture_episodes_give_bf16_gradients_of_an_fp32_reference(tiny_vision_dir: Path) -> None:
    figures = picture_gradient_agreement(tiny_vision_dir, "cuda:0", "bfloat16")
    record("vision_learner_bf16_vs_fp32", figures)
    assert figures["images"] == 6 and figures["reference_norm"] > 0 and figures["stepped"]
    assert figures["gradient_cosine"] > 0.99 and figures["gradient_relative_error"] < 0.1, figures


def test_a_cuda_step_leaves_the_callers_rng_as_it_was(tiny_model_dir: Path) -> None:
    learner = Learner(tiny_model_dir, _config(), placement=_placement("cuda:0", "bfloat16"))
    sequences = _sequences(learner.model.config.vocab_size, [1.0, -1.0])
    torch.cuda.manual_seed_all(1234)
    cpu_before, cuda_before = torch.get_rng_state(), torch.cuda.get_rng_state(0)
    result = learner.train_step(sequences, seed=7)
    assert not result.skipped and result.metrics["memory_peak_gb"] > 0
    assert torch.equal(torch.get_rng_state(), cpu_before)
    assert torch.equal(torch.cuda.get_rng_state(0), cuda_before)


def test_what_a_worker_returns_is_on_the_cpu(tiny_model_dir: Path) -> None:
    from trainer.learner.worker import to_cpu

    learner = Learner(tiny_model_dir, _config(), placement=_placement("cuda:0", "bfloat16"))
    sequences = _sequences(learner.model.config.vocab_size, [1.0, -1.0])
    learner.train_step(sequences, seed=0)
    returned = [
        to_cpu(learner.adapter_state()),
        to_cpu(learner.training_state()),
        to_cpu(learner.shard_old_logprobs(sequences)),
    ]
    found: list[torch.Tensor] = []

    def walk(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk(returned)
    assert found and all(tensor.device.type == "cpu" for tensor in found)


def test_the_ray_worker_device_sets_the_cuda_device() -> None:
    from trainer.learner.distributed import worker_device

    device = torch.device(worker_device("cuda"))
    torch.cuda.set_device(device)  # refused a bare "cuda" before
    assert torch.cuda.current_device() == 0


def test_placement_sees_the_gpu_and_children_see_what_cuda_visible_devices_gives() -> None:
    gpus = detect_gpus()
    assert gpus and all(gpu.memory_bytes and gpu.memory_bytes > 1e9 for gpu in gpus)
    placement = place(_config(), node_for(_config(), gpus))
    assert placement.learner_device == "cuda:0" and placement.learner_dtype == "bfloat16"
    assert placement.engine_device == "cuda:0" and placement.engine_dtype == "bfloat16"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": cuda_visible_devices([len(gpus) - 1])}
    probe = "import torch; print(torch.cuda.device_count(), torch.cuda.get_device_name(0))"
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    count, name = done.stdout.split(" ", 1)
    assert int(count) == 1 and name.strip() == gpus[-1].name
    hidden = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert hidden.stdout.strip() == "0"
