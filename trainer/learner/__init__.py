"""The learner: the trained model and its optimizer (``learner``), vision-language inputs (``vision``),
data-parallel workers on Ray (``distributed``) and checkpoints (``checkpoint``).

``from trainer.learner import Learner`` loads torch, transformers and peft only when used.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "Learner": "trainer.learner.learner",
    "StepResult": "trainer.learner.steps",
    "RayLearner": "trainer.learner.distributed",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'trainer.learner' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
