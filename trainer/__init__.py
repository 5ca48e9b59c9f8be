"""Training side of rftkit: ``rft train`` (GRPO on a LoRA adapter), its config, loop and parts.

The heavy parts (torch, transformers, peft) load only when used: ``from trainer import train``.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "TrainConfig": "trainer.config",
    "ConfigError": "trainer.config",
    "load_config": "trainer.config",
    "train": "trainer.loop",
    "RunSummary": "trainer.run",
    "EvaluationHook": "trainer.run",
    "TrainingError": "trainer.errors",
    "Learner": "trainer.learner.learner",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'trainer' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
