"""The learner: the trained model and its optimizer (``learner``), vision-language inputs (``vision``),
data-parallel workers on Ray (``distributed``), learner processes of one node, sharded or not
(``processes``, ``rank``, ``fsdp``) and checkpoints (``checkpoint``).

``from trainer.learner import Learner`` loads torch, transformers and peft only when used.
"""

from __future__ import annotations

from handlers import lazy_attributes

_LAZY = {
    "Learner": "trainer.learner.learner",
    "StepResult": "trainer.learner.steps",
    "RayLearner": "trainer.learner.distributed",
    "ProcessLearner": "trainer.learner.processes",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
