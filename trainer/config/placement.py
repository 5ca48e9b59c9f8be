"""The placement section: which devices the learner and the engine get."""

from __future__ import annotations

from pydantic import (
    Field,
)

from trainer.config.common import _Section


class PlacementConfig(_Section):
    """Which GPUs of this node exist for planning; `rft plan` checks the memory of each."""

    num_gpus: int | None = Field(
        default=None,
        ge=0,
        description="GPUs to plan for; unset: the CUDA devices torch sees. Declare it to plan for a "
        "machine other than this one.",
    )
    gpu_memory_gb: float | None = Field(
        default=None,
        gt=0,
        description="Memory of each GPU in GB (10^9 bytes); unset: what torch reports. A declared "
        "value wins, e.g. to keep room for another process.",
    )
