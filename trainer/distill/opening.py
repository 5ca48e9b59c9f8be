"""Opening the distillation section's teacher: a vLLM server (any learner), or a model beside a learner
in the trainer's own process."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trainer.config import TrainConfig
from trainer.distill.endpoint import EndpointTeacher
from trainer.distill.step import Scorer
from trainer.distill.teacher import Teacher
from trainer.errors import TrainingError
from trainer.learner.learner import Learner

if TYPE_CHECKING:
    from trainer.learner.distributed import RayLearner
    from trainer.learner.processes import ProcessLearner


def open_teacher(
    config: TrainConfig, base_model: Path, learner: Learner | RayLearner | ProcessLearner
) -> Scorer | None:
    """The distillation section's teacher: a vLLM server's (its tokenizer checked), or a model beside
    the learner (its device and dtype); None without one."""
    settings = config.distillation
    if settings is None or settings.weight == 0.0:
        return None
    if settings.endpoint is not None:
        return EndpointTeacher(
            settings,
            base_model,
            max_retries=config.max_retries,
            retry_backoff_s=config.retry_backoff_s,
            batch_tokens=config.max_tokens_per_microbatch,
        )
    if not isinstance(learner, Learner):
        raise TrainingError(
            "distillation with a ray section or learner processes: the teacher is loaded beside a "
            "learner in this process, and Ray's learner workers or learner.processes run elsewhere; "
            "remove the ray section (or learner.processes, learner.shard) to distil, or serve the "
            "teacher with vLLM and give its URL as distillation.teacher"
        )
    return Teacher(
        settings,
        base_model,
        device=learner.device,
        dtype=learner.dtype,
        micro_batch_tokens=config.max_tokens_per_microbatch,
        logits_chunk_size=config.learner.logits_chunk_size,
    )
