"""The stages of the offline GPU check (``bench/device_check.sh`` runs each with a deadline).

    python bench/device_stages.py STAGE --work DIR [--device cuda|cpu] [--tiny]
    python bench/device_stages.py merge --work DIR --out device_check.json [--device ...] [--tiny]

Stages (each writes ``DIR/STAGE.json``: its results, or a sentence saying why it failed):

- ``tests``: the suite's tests marked ``gpu`` (``pytest -m gpu``), their figures (gradient cosine
  against float32, sampler-vs-teacher-forced logprobs) and outcomes;
- ``demo``: the maze demo's quick plan (fewer GRPO steps on a GPU) with the hf engine and the
  learner on the device, the real maze agent over loopback: success before and after, step time
  split into rollouts, update and adapter load;
- ``vision``: the same for the visual maze at smoke sizes: the tiny VLM sees PNGs of the map, its
  pixels go through the hf engine and the learner on the device;
- ``memory``: random-initialised models of three real shapes (``bench/model_configs``): a LoRA GRPO
  update at a fixed token budget, with and without checkpointing: peak memory against ``rft plan``'s
  estimate, update tokens per second and MFU; hf-engine sampling tokens per second at 1, 8 and 64
  concurrent calls, its decode step beside its forward pass alone; the sampler-vs-learner logprob
  mismatch on the same weights;
- ``moe``: gpt-oss-20b's shape (random weights, LoRA on attention and on the experts, the family's
  chunked attention, gradient checkpointing): one update of one row of 4096 and of 8192 tokens, its
  peak memory against ``rft plan``'s;
- ``gateway``: ``rft serve`` over the hf engine on the device, driven at 1, 16 and 64 clients.

``--tiny`` (with ``--device cpu``, the suite's dry run) shrinks every size so the same code runs in
about a minute on a CPU. Models are built on the spot (random weights, the tiny tokenizer): nothing
is downloaded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for path in (str(REPO), str(REPO / "bench")):
    if path not in sys.path:
        sys.path.insert(0, path)

STAGES = ("tests", "demo", "vision", "memory", "moe", "gateway")
H200_BF16_FLOPS = 790e12  # dense bf16 peak the MFU is against
MODEL_CONFIGS = REPO / "bench" / "model_configs"
MODELS = ("qwen2.5-0.5b", "qwen2.5-3b", "llama-3-8b")
CONCURRENCY = (1, 8, 64)
GATEWAY_CLIENTS = (1, 16, 64)


def _device(args: argparse.Namespace) -> str:
    return "cuda:0" if args.device == "cuda" else "cpu"


def _dtype(args: argparse.Namespace) -> str:
    return "bfloat16" if args.device == "cuda" else "float32"


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


# --- stage 1: the tests marked gpu --------------------------------------------------------------------


def gpu_test_files() -> list[str]:
    """The test files that hold tests marked gpu (collecting only them: the others may import what the
    GPU machine lacks, e.g. Ray)."""
    return sorted(
        str(path.relative_to(REPO))
        for path in (REPO / "tests").rglob("test_*.py")
        if "pytest.mark.gpu" in path.read_text(encoding="utf-8")
    )


def stage_tests(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work)
    junit, figures = work / "tests-junit.xml", work / "tests-figures.jsonl"
    figures.unlink(missing_ok=True)
    files = gpu_test_files()
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gpu",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
    ]
    env = {**os.environ, "RFTKIT_GPU_FIGURES": str(figures)}
    done = subprocess.run([*command, *files], cwd=REPO, env=env, capture_output=True, text=True)
    tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
    outcomes = _junit_outcomes(junit) if junit.exists() else {}
    found = [json.loads(line) for line in figures.read_text().splitlines()] if figures.exists() else []
    result = {
        "files": files,
        "exit_code": done.returncode,
        "outcomes": outcomes,
        "figures": found,
        "tail": tail,
    }
    if done.returncode == 5 and not outcomes:  # all deselected: no CUDA device here
        result["skipped"] = "torch sees no CUDA device: the tests marked gpu were deselected"
        return result
    if done.returncode != 0:
        failed = sorted(name for name, outcome in outcomes.items() if outcome["outcome"] != "passed")
        raise StageFailed(
            f"pytest -m gpu failed (exit {done.returncode}): {', '.join(failed) or tail[-1]}", result
        )
    return result


def _junit_outcomes(path: Path) -> dict[str, dict[str, Any]]:
    outcomes = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        outcome = "passed"
        message = None
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "skipped" if child.tag == "skipped" else "failed"
                message = (child.get("message") or "")[:300]
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcomes[name] = {"outcome": outcome, "seconds": float(case.get("time") or 0), "message": message}
    return outcomes


# --- stage 2: the maze demo ---------------------------------------------------------------------------


def _tiny_plan(observation: str) -> Any:
    """Every stage of a demo run in seconds on a CPU: the dry run's plan."""
    from agents.maze.demo.plans import VISION_QUICK, DemoPlan

    rope = {}
    if observation == "image":
        rope = {
            "vision_rope_theta": VISION_QUICK.vision_rope_theta,
            "vision_mrope": VISION_QUICK.vision_mrope,
        }
    return DemoPlan(
        train_mazes=40,
        sft_demos=8,
        sft_steps=4,
        sft_batch_size=4,
        grpo_steps=2,
        rows_per_step=1,
        eval_rows=2,
        num_generations=4,
        num_iterations=1,
        warmup_steps=0,
        eval_generations=1,
        observation=observation,
        **rope,
    )


# GRPO steps of the quick plan the demo stage runs on a GPU: the hf engine's decode step took about
# 90 ms on the H200 whatever the model's size (docs/gpu.md), so a step of the quick plan took 13 s
# and its 16 would not fit the budget. The stage proves the path and times its parts; that the plan
# learns is the CPU suite's to show.
GPU_DEMO_GRPO_STEPS = 4


def stage_demo(args: argparse.Namespace) -> dict[str, Any]:
    from agents.maze.demo.plans import QUICK

    plan = _tiny_plan("text") if args.tiny else dataclasses.replace(QUICK, grpo_steps=GPU_DEMO_GRPO_STEPS)
    return _run_demo(args, plan, "demo", f"quick, {GPU_DEMO_GRPO_STEPS} GRPO steps")


def stage_vision(args: argparse.Namespace) -> dict[str, Any]:
    # The sizes `rft demo --vision --quick` had before it was sized to learn (the run the H200 passed):
    # its 500 picture warm-start steps alone would outlast the stage (40 took 31 s there). The picture
    # update's numbers on CUDA are the gpu-marked learner test's to check.
    plan = _tiny_plan("image")
    if not args.tiny:
        sizes = {"train_mazes": 100, "sft_demos": 40, "sft_steps": 40, "sft_batch_size": 8}
        plan = dataclasses.replace(plan, **sizes, sft_learning_rate=1e-2, rows_per_step=2, eval_rows=8)
    return _run_demo(args, plan, "vision", "vision, smoke sizes")


def _run_demo(args: argparse.Namespace, plan: Any, name: str, label: str) -> dict[str, Any]:
    """One demo run (warm start, then GRPO through the real maze agent) on the device, in WORK/NAME;
    ``label`` names the plan in the report."""
    from device_check import summarise

    from agents.maze.dataset import write_dataset
    from agents.maze.demo.agent_process import serve_agent
    from agents.maze.demo.grpo_config import train_config
    from agents.maze.demo.model import build_demo_model, warm_start
    from trainer import train
    from trainer.ops.metrics import NO_MLFLOW

    run_dir = Path(args.work) / name
    started = time.monotonic()
    write_dataset(run_dir / "data", plan.train_mazes, plan.observation)
    model_dir, targets = build_demo_model(plan, run_dir / "model", args.seed)
    sft = warm_start(plan, model_dir, targets, run_dir / "sft-adapter", args.seed)
    warm_start_s = time.monotonic() - started
    with serve_agent() as agent_url:
        config = train_config(
            plan,
            model_dir=model_dir,
            init_adapter=sft.adapter_dir,
            data_dir=run_dir / "data",
            output_dir=run_dir / "grpo",
            agent_url=agent_url,
            engine="hf",
            target_modules=targets,
            seed=args.seed,
        )
        learner = config.learner.model_copy(update={"device": _device(args)})
        config = config.model_copy(update={"learner": learner, "mlflow_tracking_uri": NO_MLFLOW})
        summary = train(config)
    before, after = summary.evaluations[0], summary.evaluations[-1]
    return {
        "plan": f"tiny ({plan.observation})" if args.tiny else label,
        "learner_and_engine": f"{_device(args)} ({_dtype(args)})",
        "warm_start": {"seconds": warm_start_s, "steps": len(sft.losses), "last_loss": sft.losses[-1]},
        "success_rate": {"before": before["success_rate"], "after": after["success_rate"]},
        "mean_reward": {"before": before["mean_reward"], "after": after["mean_reward"]},
        "improvement_points": 100 * (after["success_rate"] - before["success_rate"]),
        **summarise(summary.history),
        "seconds": time.monotonic() - started,
    }


def demo_partial(work: Path, name: str) -> dict[str, Any] | None:
    """A demo stage's step times so far, from its metrics.jsonl (when the stage ran out of time)."""
    path = work / name / "grpo" / "metrics.jsonl"
    if not path.exists():
        return None
    steps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {
        "steps_done": len(steps),
        "step_time_s": [step.get("time_s") for step in steps],
        "success_rate": [step.get("success_rate") for step in steps],
    }


# --- stage 3: the memory plan against reality, throughput, mismatch ------------------------------------


def _random_loader(device: str, seed: int) -> Callable[..., Any]:
    """A stand-in for ``load_model``: the directory's config.json, random weights built on ``device``
    (the same seed gives the same weights to the learner and the engine)."""

    def load(model_dir: str | Path, dtype: Any = None, **options: Any) -> Any:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(str(model_dir))
        extra = (
            {"attn_implementation": options["attn_implementation"]}
            if "attn_implementation" in options
            else {}
        )
        torch.manual_seed(seed)
        with torch.device(device):
            return AutoModelForCausalLM.from_config(config, dtype=dtype, **extra)

    return load


@contextlib.contextmanager
def random_weights(device: str, seed: int) -> Iterator[None]:
    """The learner and the hf engine load random weights from a config.json alone (no download)."""
    import policy_server.engines.hf as hf_module
    import trainer.learner.base_load as learner_module

    saved = learner_module.load_model, hf_module.load_model
    learner_module.load_model = hf_module.load_model = _random_loader(device, seed)
    try:
        yield
    finally:
        learner_module.load_model, hf_module.load_model = saved


def _model_dir(args: argparse.Namespace, name: str, tokenizer_dir: Path) -> tuple[Path, dict[str, Any]]:
    """A directory with the shape's config.json and the tiny model's tokenizer (its ids are a prefix of
    any vocabulary; sampled ids past it decode to nothing)."""
    config = json.loads((MODEL_CONFIGS / f"{name}.json").read_text())
    if args.tiny:  # the same family, a few MB: 2 layers, narrow, a 2k vocabulary
        config.update(hidden_size=128, intermediate_size=256, num_hidden_layers=2, vocab_size=2048)
        config.update(num_attention_heads=4, num_key_value_heads=2)
    directory = Path(args.work) / "models" / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    for item in tokenizer_dir.iterdir():
        if item.name not in ("config.json", "model.safetensors", "generation_config.json"):
            (directory / item.name).write_bytes(item.read_bytes())
    return directory, config


def _sequences(vocab: int, count: int, length: int, seed: int) -> list[Any]:
    from trainer.algo.sequences import TrainingSequence

    rng = random.Random(seed)
    prompt = length // 4
    return [
        TrainingSequence(
            rollout_id=f"r{index}",
            token_ids=[rng.randrange(vocab) for _ in range(length)],
            loss_mask=[0] * prompt + [1] * (length - prompt),
            behavior_logprobs=[0.0] * prompt + [-math.log(vocab)] * (length - prompt),
            advantage=1.0 if index % 2 else -1.0,
            num_calls=1,
        )
        for index in range(count)
    ]


def _memory_now(device: str) -> dict[str, float | None]:
    import torch

    if not device.startswith("cuda"):
        return {"allocated_gb": None, "peak_allocated_gb": None, "peak_reserved_gb": None}
    return {
        "allocated_gb": torch.cuda.memory_allocated() / 1e9,
        "peak_allocated_gb": torch.cuda.max_memory_allocated() / 1e9,
        "peak_reserved_gb": torch.cuda.max_memory_reserved() / 1e9,
    }


def _plan_items(config: Any, shape: Any, device: str) -> dict[str, Any]:
    """``rft plan``'s learner items on the device (GB) and their update-phase peak without the CUDA
    context (which torch's allocator does not count)."""
    import torch

    from trainer.scale.placement import Gpu, Node
    from trainer.scale.plan import make_plan

    capacity = torch.cuda.get_device_properties(0).total_memory if device.startswith("cuda") else None
    node = (
        Node([Gpu(0, capacity, "GPU")], present=True)
        if device.startswith("cuda")
        else Node([], present=False)
    )
    plan = make_plan(config, shape, node)
    (placed,) = [entry for entry in plan.devices if entry.device == device]
    items = [item for item in placed.items if not item.label.startswith("hf engine")]
    named = {item.label.split(" (")[0]: item.bytes / 1e9 for item in items}
    peak = sum(item.bytes for item in items if "CUDA context" not in item.label) / 1e9
    return {"items_gb": named, "update_peak_gb_without_cuda_context": peak}


def _update_flops(shape: Any, tokens: int, length: int, recompute: bool) -> float:
    """Matrix FLOPs of one LoRA update: forward 2N, backward (input gradients of the frozen base) 2N,
    a recompute 2N more with checkpointing; N the matrices' parameters (lm_head included, the input
    embedding not); causal attention 2 x 2 x layers x (length / 2) x q_width per token and pass."""
    matrices = shape.parameters() - shape.vocab * shape.hidden * (0 if shape.tied_embeddings else 1)
    per_pass = 2 * matrices + 2 * 2 * shape.layers * (length / 2) * shape.heads * shape.head_dim
    return tokens * per_pass * (3 if recompute else 2)


def _measure_update(
    learner: Any, sequences: list[Any], device: str, shape: Any, length: int, checkpointing: bool
) -> dict[str, Any]:
    import torch

    learner.train_step(sequences, seed=0)  # warm-up: kernels chosen, AdamW's state made
    _sync(device)
    resident = torch.cuda.memory_allocated() / 1e9 if device.startswith("cuda") else None
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    result = learner.train_step(sequences, seed=1)
    _sync(device)
    seconds = time.perf_counter() - started
    tokens = sum(len(sequence) for sequence in sequences)
    flops = _update_flops(shape, tokens, length, checkpointing)
    return {
        "checkpointing": checkpointing,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "mfu": flops / seconds / H200_BF16_FLOPS if device.startswith("cuda") else None,
        "resident_before_step_gb": resident,
        "loss_finite": math.isfinite(result.metrics["loss"]),
        **_memory_now(device),
    }


async def _sample(
    engine: Any, concurrency: int, max_tokens: int, seed: int
) -> tuple[dict[str, Any], list[Any]]:
    from policy_server.engines import GenerationRequest

    requests = [
        GenerationRequest(
            messages=[{"role": "user", "content": f"Walk maze {index}: ##.#\n#S.#\n#.G#"}],
            max_tokens=max_tokens,
            temperature=1.0,
            seed=seed + index,
        )
        for index in range(concurrency)
    ]
    started = time.perf_counter()
    results = await asyncio.gather(*map(engine.generate, requests))
    seconds = time.perf_counter() - started
    tokens = sum(len(result.completion_token_ids) for result in results)
    return {
        "calls": concurrency,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        # Every call samples max_tokens (random weights rarely stop): one decode step per token.
        "engine_step_ms": 1000 * seconds / max_tokens,
    }, results


def _model_step_ms(engine: Any, device: str, rows: int, context: int = 64, steps: int = 16) -> float:
    """One decode step of the engine's forward pass alone (its adapter switch, cache and invariance
    settings; ``rows`` rows, ``context`` cached tokens, greedy), in ms: beside the engine's step time it
    shows what the engine's loop adds (batching, sampling, Python)."""
    import torch
    from transformers import Cache

    from policy_server.engines.hf_batch import GrowingLayer

    ids = torch.randint(0, 1000, (rows, context), device=device)
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        cache = Cache(layer_class_to_replicate=GrowingLayer)
        positions = torch.arange(context, device=device).expand(rows, context)
        lengths = [context] * rows
        logits = engine._forward(
            0, cache, (lengths, lengths), input_ids=ids, attention_mask=mask, position_ids=positions
        )
        _sync(device)
        started = time.perf_counter()
        for step in range(steps):
            mask = torch.ones((rows, context + step + 1), dtype=torch.long, device=device)
            logits = engine._forward(
                0,
                cache,
                ([1] * rows, [context + step + 1] * rows),
                input_ids=logits.argmax(-1, keepdim=True),
                attention_mask=mask,
                position_ids=torch.full((rows, 1), context + step, device=device),
            )
        _sync(device)
    return 1000 * (time.perf_counter() - started) / steps


def _mismatch(learner: Any, results: list[Any]) -> dict[str, Any]:
    """The learner's logprobs (adapter off: the engine serves the base) of what the engine sampled."""
    import torch

    from trainer.algo.sequences import TrainingSequence

    sequences = [
        TrainingSequence(
            rollout_id=f"m{index}",
            token_ids=result.prompt_token_ids + result.completion_token_ids,
            loss_mask=[0] * len(result.prompt_token_ids) + [1] * len(result.completion_token_ids),
            behavior_logprobs=[0.0] * len(result.prompt_token_ids) + list(result.completion_logprobs),
            advantage=0.0,
            num_calls=1,
        )
        for index, result in enumerate(results)
        if result.completion_token_ids
    ]
    with learner.model.disable_adapter():
        learner_logprobs = learner.old_logprobs(sequences)
    differences = []
    for sequence, logprobs in zip(sequences, learner_logprobs, strict=True):
        mask = torch.tensor(sequence.loss_mask, dtype=torch.bool)
        behavior = torch.tensor(sequence.behavior_logprobs, dtype=torch.float64)
        differences.append((logprobs.double().cpu() - behavior)[mask])
    delta = torch.cat(differences)
    k3 = torch.exp(delta) - delta - 1
    return {
        "tokens": int(delta.numel()),
        "k3_kl_mean": float(k3.mean()),
        "max_abs_logprob_diff": float(delta.abs().max()),
    }


def _measure_model(args: argparse.Namespace, name: str, tokenizer_dir: Path) -> dict[str, Any]:
    import torch

    from policy_server.engines import HFEngine
    from trainer.config import TrainConfig
    from trainer.learner import Learner
    from trainer.learner.model import enable_checkpointing
    from trainer.ops.metrics import NO_MLFLOW
    from trainer.scale.memory import ModelShape
    from trainer.scale.placement import Placement

    device, dtype = _device(args), _dtype(args)
    model_dir, config_json = _model_dir(args, name, tokenizer_dir)
    shape = ModelShape.from_config(config_json)
    length, count = (64, 4) if args.tiny else (1024, 8)
    fields = {
        "model": str(model_dir),
        "learner": {"device": device, "logits_chunk_size": 1024},
        "lora": {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"},
        "max_tokens_per_microbatch": length * count,
        "loss_type": "dapo",
        "learning_rate": 1e-5,
        "mlflow_tracking_uri": NO_MLFLOW,
    }
    placement = Placement(device, dtype, device, dtype, [])
    result: dict[str, Any] = {
        "parameters_b": shape.parameters() / 1e9,
        "sequences": f"{count} x {length} tokens",
    }
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    # What a previous model left allocated (nothing, if all was freed): subtracted from the peaks.
    start_gb = _memory_now(device)["allocated_gb"] or 0.0
    result["allocated_before_gb"] = _memory_now(device)["allocated_gb"]
    with random_weights(device, args.seed):
        learner = Learner(model_dir, TrainConfig.model_validate(fields), placement=placement)
        allocated = _memory_now(device)["allocated_gb"]
        result["weights_and_lora_gb"] = None if allocated is None else allocated - start_gb
        sequences = _sequences(shape.vocab, count, length, args.seed)
        updates = []
        for checkpointing in (False, True):
            config = TrainConfig.model_validate(
                {**fields, "learner": {**fields["learner"], "gradient_checkpointing": checkpointing}}
            )
            if checkpointing:
                learner.model.get_base_model().config.use_cache = False
                enable_checkpointing(learner.model.get_base_model())
            try:
                measured = _measure_update(learner, sequences, device, shape, length, checkpointing)
            except torch.cuda.OutOfMemoryError as error:
                measured = {"checkpointing": checkpointing, "out_of_memory": str(error).splitlines()[0]}
                gc.collect()
                torch.cuda.empty_cache()
            plan = _plan_items(config, shape, device)
            measured["plan"] = plan
            if measured.get("peak_allocated_gb"):
                measured["peak_over_plan"] = (measured["peak_allocated_gb"] - start_gb) / plan[
                    "update_peak_gb_without_cuda_context"
                ]
                weights = plan["items_gb"]["learner weights"]
                measured["weights_over_plan"] = (result["weights_and_lora_gb"] or 0) / weights
                working = measured["peak_allocated_gb"] - (measured["resident_before_step_gb"] or 0)
                planned = sum(
                    gb
                    for label, gb in plan["items_gb"].items()
                    if not label.startswith(("learner weights", "LoRA r="))
                )
                measured["update_working_set_over_plan"] = working / planned if planned else None
            updates.append(measured)
        result["updates"] = updates
        engine = HFEngine(
            model_dir,
            device=device,
            dtype=getattr(torch, dtype),
            max_batch_size=max(CONCURRENCY),
            seed=args.seed,
        )
        sampling, mismatch = asyncio.run(_sample_and_compare(engine, learner, args))
        result["sampling"] = sampling
        result["sampler_vs_learner"] = mismatch
    del learner, engine
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return result


async def _sample_and_compare(
    engine: Any, learner: Any, args: argparse.Namespace
) -> tuple[list[Any], dict[str, Any]]:
    max_tokens = 8 if args.tiny else 64
    await engine.start()
    try:
        sampling, compared = [], []
        for concurrency in CONCURRENCY:
            measured, results = await _sample(engine, concurrency, max_tokens, args.seed)
            measured["model_step_ms"] = _model_step_ms(engine, _device(args), concurrency)
            sampling.append(measured)
            if concurrency == 8:
                compared = results
        same = _same_weights(engine, learner)
    finally:
        await engine.close()
    return sampling, {**_mismatch(learner, compared), "same_weights": same, "dtype": _dtype(args)}


def _same_weights(engine: Any, learner: Any) -> bool:
    import torch

    served = engine._model.get_input_embeddings().weight
    trained = learner.model.get_base_model().get_input_embeddings().weight
    return bool(torch.equal(served.float().cpu(), trained.float().cpu()))


def stage_memory(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from policy_server.models import build_tiny_model

    tokenizer_dir = build_tiny_model(Path(args.work) / "tokenizer-model", seed=args.seed)
    results: dict[str, Any] = {}
    for name in MODELS:
        try:
            results[name] = _measure_model(args, name, tokenizer_dir)
        except Exception as error:  # the other sizes still run; the stage fails at the end
            results[name] = {
                "error": f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            }
            traceback.print_exc()
        print(f"memory stage: {name} done", flush=True)
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else None
    out = {"gpu": gpu, "mfu_against_tflops": H200_BF16_FLOPS / 1e12, "models": results}
    failed = [name for name, result in results.items() if "error" in result]
    if failed:
        raise StageFailed(f"the memory stage failed for {', '.join(failed)}", out)
    return out


# --- stage 3b: a gpt-oss-20b-shaped learner at 4k and 8k tokens -----------------------------------------

MOE_MODEL = "gpt-oss-20b"
MOE_EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
MOE_TOKENS = (4096, 8192)


def _moe_model_dir(args: argparse.Namespace, tokenizer_dir: Path) -> tuple[Path, dict[str, Any]]:
    """gpt-oss-20b's published shape (bench/model_configs) with its sliding windows, or a few-MB copy
    of the same family for the dry run; the tiny model's tokenizer."""
    config = json.loads((MODEL_CONFIGS / f"{MOE_MODEL}.json").read_text())
    config.update(sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 12)
    if args.tiny:
        config.update(hidden_size=128, intermediate_size=64, num_hidden_layers=2, vocab_size=2048)
        config.update(num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_local_experts=4)
        config.update(num_experts_per_tok=2, sliding_window=16, layer_types=config["layer_types"][:2])
    directory = Path(args.work) / "models" / MOE_MODEL
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    for item in tokenizer_dir.iterdir():
        if item.name not in ("config.json", "model.safetensors", "generation_config.json"):
            (directory / item.name).write_bytes(item.read_bytes())
    return directory, config


def stage_moe(args: argparse.Namespace) -> dict[str, Any]:
    """gpt-oss-20b's shape with random bf16 weights, LoRA r=16 on attention and on the experts
    (target_parameters), its family's chunked attention, gradient checkpointing on: one GRPO update of
    one row of 4096 and of 8192 tokens, the peak allocated against ``rft plan``'s update peak."""
    import torch

    from policy_server.models import build_tiny_model
    from trainer.config import TrainConfig
    from trainer.learner import Learner
    from trainer.ops.metrics import NO_MLFLOW
    from trainer.scale.memory import ModelShape
    from trainer.scale.placement import Placement

    device, dtype = _device(args), _dtype(args)
    tokenizer_dir = build_tiny_model(Path(args.work) / "tokenizer-model", seed=args.seed)
    model_dir, config_json = _moe_model_dir(args, tokenizer_dir)
    shape = ModelShape.from_model_dir(model_dir)  # the family's attention: no [T, T] term
    lengths = (48, 96) if args.tiny else MOE_TOKENS
    fields: dict[str, Any] = {
        "model": str(model_dir),
        "learner": {"device": device, "logits_chunk_size": 1024, "gradient_checkpointing": True},
        "lora": {"r": 16, "lora_dropout": 0.0, "target_parameters": MOE_EXPERTS},
        "max_tokens_per_microbatch": max(lengths),
        "learning_rate": 1e-5,
        "mlflow_tracking_uri": NO_MLFLOW,
    }
    config = TrainConfig.model_validate(fields)
    placement = Placement(device, dtype, device, dtype, [])
    result: dict[str, Any] = {"parameters_b": shape.parameters() / 1e9, "gpu": None, "updates": []}
    if device.startswith("cuda"):
        result["gpu"] = torch.cuda.get_device_name(0)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    with random_weights(device, args.seed):
        learner = Learner(model_dir, config, placement=placement)
    result["attention"] = learner.base_load.attn_implementation
    result["weights_and_lora_gb"] = _memory_now(device)["allocated_gb"]
    for length in lengths:
        sequences = _sequences(shape.vocab, 1, length, args.seed)
        try:
            measured = _measure_update(learner, sequences, device, shape, length, True)
            measured.pop("mfu")  # counted from all 21 B parameters: meaningless with 4 of 32 experts active
        except torch.cuda.OutOfMemoryError as error:
            measured = {"tokens": length, "out_of_memory": str(error).splitlines()[0]}
            gc.collect()
            torch.cuda.empty_cache()
        sized = config.model_copy(update={"max_tokens_per_microbatch": length})
        measured["plan"] = _plan_items(sized, shape, device)
        if measured.get("peak_allocated_gb"):
            planned = measured["plan"]["update_peak_gb_without_cuda_context"]
            measured["peak_over_plan"] = measured["peak_allocated_gb"] / planned
        result["updates"].append(measured)
        print(f"moe stage: {length} tokens done", flush=True)
    failed = [update["tokens"] for update in result["updates"] if "out_of_memory" in update]
    if failed:
        raise StageFailed(f"the gpt-oss-20b update ran out of memory at {failed} tokens", result)
    return result


# --- stage 4: the gateway over the hf engine -----------------------------------------------------------


def stage_gateway(args: argparse.Namespace) -> dict[str, Any]:
    from gateway_overhead import JOB, drive, wait_serving  # drive() sends that job's ARN

    from policy_server.engines import free_port
    from policy_server.models import build_tiny_model

    model_dir = build_tiny_model(Path(args.work) / "gateway-model", seed=args.seed)
    port = free_port()
    command = [
        sys.executable, "-m", "handlers.cli", "serve", "--engine", "hf", "--model", str(model_dir),
        "--device", _device(args), "--port", str(port), "--open-job", JOB, "--log-level", "warning",
        "--max-calls-per-rollout", "1000000", "--max-open-rollouts", "1000000",
    ]  # fmt: skip
    log = open(Path(args.work) / "gateway.log", "wb")
    server = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    clients = (1, 4) if args.tiny else GATEWAY_CLIENTS
    per_client = 2 if args.tiny else 10
    try:
        asyncio.run(wait_serving(url, direct=False, timeout_s=120))
        rows = [
            {"clients": count, **asyncio.run(drive(url, direct=False, clients=count, per_client=per_client))}
            for count in clients
        ]
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    return {
        "engine": f"hf on {_device(args)}",
        "gateway_workers": 1,
        "four_workers": "not measured: more than one gateway worker needs the vllm engine (the hf engine "
        "runs in the serving process), and vLLM's GPU build does not fit the offline pack",
        "max_tokens": 8,
        "rows": rows,
    }


# --- running a stage, and the report ---------------------------------------------------------------------


class StageFailed(Exception):
    """A stage that ran but did not pass: a sentence, and what it measured."""

    def __init__(self, sentence: str, results: dict[str, Any]) -> None:
        super().__init__(sentence)
        self.results = results


RUNNERS = {
    "tests": stage_tests,
    "demo": stage_demo,
    "vision": stage_vision,
    "memory": stage_memory,
    "moe": stage_moe,
    "gateway": stage_gateway,
}


def run_stage(args: argparse.Namespace) -> int:
    # The shell's deadline sends SIGTERM: exit through the finally blocks, so the servers a stage
    # started (in sessions of their own) are stopped with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    record: dict[str, Any] = {"stage": args.command}
    try:
        record["results"] = RUNNERS[args.command](args)
        record["status"] = "skipped" if record["results"].get("skipped") else "ok"
        if record["status"] == "skipped":
            record["sentence"] = record["results"]["skipped"]
    except StageFailed as failed:
        record.update(status="failed", sentence=str(failed), results=failed.results)
    except Exception as error:
        traceback.print_exc()
        first = str(error).splitlines()[0] if str(error) else ""
        record.update(
            status="failed", sentence=f"the {args.command} stage failed: {type(error).__name__}: {first}"
        )
    record["seconds"] = time.monotonic() - started
    (Path(args.work) / f"{args.command}.json").write_text(json.dumps(record, indent=2, default=str))
    print(
        f"device_check: {args.command}: {record['status']}"
        + (f": {record['sentence']}" if "sentence" in record else "")
    )
    return 0 if record["status"] != "failed" else 1


def merge(args: argparse.Namespace) -> dict[str, Any]:
    """device_check.json: every stage, its status and sentence (a stage the shell stopped or skipped
    has a status file instead of a JSON), the machine, and the demo's steps when it ran out of time."""
    import torch

    work = Path(args.work)
    stages: dict[str, Any] = {}
    for stage in STAGES:
        path, status = work / f"{stage}.json", work / f"{stage}.status"
        if path.exists():
            stages[stage] = json.loads(path.read_text())
        else:
            stages[stage] = {"stage": stage, "status": "not run", "results": None}
        if status.exists():  # the shell's word wins: a timeout, a skip for lack of budget
            state, _, sentence = status.read_text().strip().partition(": ")
            if state in ("timeout", "skipped", "killed"):
                stages[stage].update(status=state, sentence=sentence)
        if stage in ("demo", "vision") and stages[stage]["status"] == "timeout":
            stages[stage]["partial"] = demo_partial(work, stage)
    cuda = torch.cuda.is_available()
    report = {
        "device": args.device,
        "tiny": args.tiny,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "gpu_memory_gb": torch.cuda.get_device_properties(0).total_memory / 1e9 if cuda else None,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": _version("transformers"),
        "peft": _version("peft"),
        "stages": stages,
        "passed": all(stage["status"] in ("ok", "skipped") for stage in stages.values()),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2, default=str) + "\n")
    return report


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=(*STAGES, "merge"))
    parser.add_argument("--work", required=True, type=Path, help="directory for the stages' files")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes (the CPU dry run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="merge: where device_check.json goes")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.command == "merge":
        if args.out is None:
            raise SystemExit("device_stages: merge needs --out")
        report = merge(args)
        summary = {stage: record["status"] for stage, record in report["stages"].items()}
        print(f"device_check: {json.dumps(summary)} -> {args.out}")
        return 0 if report["passed"] else 1
    return run_stage(args)


if __name__ == "__main__":
    raise SystemExit(main())
