"""Learning from a teacher: on-policy distillation beside GRPO (the teacher a model beside the learner,
``teacher``, or a vLLM server, ``endpoint``; ``opening``, ``step``) and teacher demonstrations for
``rft sft`` (``rft collect``: ``collect``, ``collect_cli``); docs/distillation.md.

``from trainer.distill import Teacher`` loads torch and transformers only when used.
"""

from __future__ import annotations

from handlers import lazy_attributes

_LAZY = {
    "EndpointTeacher": "trainer.distill.endpoint",
    "Scorer": "trainer.distill.step",
    "TeacherEndpointError": "trainer.distill.endpoint",
    "Teacher": "trainer.distill.teacher",
    "TokenizerMismatch": "trainer.distill.teacher",
    "check_same_tokenizer": "trainer.distill.teacher",
    "distill_sequences": "trainer.distill.step",
    "open_teacher": "trainer.distill.opening",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
