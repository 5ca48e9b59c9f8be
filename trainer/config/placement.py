"""The placement section: which devices the learner and the engine get."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainer.config.common import _Section


class PlacementConfig(_Section):
    """Which GPUs of this node exist for planning (`rft plan` checks the memory of each), and which
    CPU kernels the run's own processes use."""

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
    cpu_kernels: Literal["avx2", "native"] = Field(
        default="avx2",
        description="CPU kernels of `rft train` and its hf engine on x86: 'avx2' pins torch's, MKL's "
        "and oneDNN's to AVX2, so a seed gives the same numbers on any x86-64 machine with AVX2, "
        "AVX-512 or not, at about the same speed (docs/reproducibility.md); 'native': each library's "
        "widest for this CPU. Variables already set in the environment win. A vLLM server keeps "
        "oneDNN's own choice.",
    )
