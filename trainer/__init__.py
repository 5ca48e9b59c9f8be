"""Training side of rftkit: ``rft train`` (GRPO on a LoRA adapter), its config, loop and parts.

The heavy parts (torch, transformers, peft) load only when used: ``from trainer import train``.
"""

from __future__ import annotations

from handlers import lazy_attributes

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

__getattr__ = lazy_attributes(__name__, _LAZY)
