"""``rft sft``: supervised warm start of a LoRA adapter on demonstrations. What text and vision share
(``common``), a demonstration's training sequences turn by turn (``turns``), the text training
(``text``), vision-language models (``vision``), the command (``cli``).

The public surface, loaded lazily (torch only when used): ``from trainer.sft import run_sft``.
"""

from __future__ import annotations

from handlers import lazy_attributes

_LAZY = {
    "run_sft": "trainer.sft.text",
    "trainee_for": "trainer.sft.text",
    "turn_logprobs": "trainer.sft.common",
    "SftResult": "trainer.sft.common",
    "StopAtLoss": "trainer.sft.common",
    "DemonstrationError": "trainer.sft.turns",
    "load_demonstrations": "trainer.sft.common",
    "encode_demonstration": "trainer.sft.turns",
    "DemonstrationFile": "trainer.sft.common",
    "demonstration_batch": "trainer.sft.common",
    "pad_token_id": "trainer.sft.common",
    "IGNORE": "trainer.sft.common",
    "PROJECTION_MODULES": "trainer.sft.common",
    "DEFAULT_TARGET_MODULES": "trainer.sft.common",
    "build_parser": "trainer.sft.cli",
    "run": "trainer.sft.cli",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
