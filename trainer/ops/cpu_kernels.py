"""The CPU kernels a run's numbers come from: the same on every x86 machine with AVX2.

torch runs its own vectorised kernels (softmax, norms, activations) at the widest instruction set
the CPU has, and MKL picks its matrix-product kernels by CPU model; each adds up in its own order,
so the same seed gives other numbers on an AVX-512 machine than on an AVX2 one (the full demo's warm
start stops at another step), while a run takes about the same time either way. So ``rft demo`` and
the suite pin both to AVX2: torch through
``ATEN_CPU_CAPABILITY`` and MKL through its conditional numerical reproducibility (``MKL_CBWR``).
Set either variable yourself to choose otherwise. GPU kernels are not affected.
"""

from __future__ import annotations

import logging
import os
import platform

log = logging.getLogger(__name__)

AVX2_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}


def pin_cpu_kernels() -> None:
    """Pin torch's and MKL's CPU kernels to AVX2 in this process and the ones it starts.

    Call it before the first tensor operation: torch reads its variable at its first vectorised
    kernel and MKL at its first call. Variables already set are left alone; other architectures
    (no AVX2, no MKL) are left alone too.
    """
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return
    for name, value in AVX2_KERNELS.items():
        os.environ.setdefault(name, value)
    import torch

    wanted = os.environ["ATEN_CPU_CAPABILITY"].upper()
    running = torch.backends.cpu.get_cpu_capability()
    if running != wanted:
        log.warning(
            "torch's CPU kernels run at %s, not %s: a tensor operation ran before pin_cpu_kernels(); "
            "set ATEN_CPU_CAPABILITY=%s before starting Python to repeat runs across machines",
            running,
            wanted,
            wanted.lower(),
        )
