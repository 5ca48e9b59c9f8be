"""The CPU kernels a run's numbers come from: the same on every x86-64 machine with AVX2.

Three libraries inside torch choose their kernels by the widest instruction set the CPU has, and
each adds up in its own order, so the same seed gives other numbers on an AVX-512 machine than on an
AVX2 one, while a run takes about the same time either way:

- torch's own vectorised kernels (softmax, norms, activations): ``ATEN_CPU_CAPABILITY``;
- MKL's matrix products, by CPU model: its conditional numerical reproducibility, ``MKL_CBWR``;
- oneDNN, which torch hands convolutions (a vision tower's patch embedding) and some activations:
  ``ONEDNN_MAX_CPU_ISA``. Uncapped, the visual maze's warm start took other steps on an AVX-512
  machine than on an AVX2 one from its second step on.

So ``rft demo``, ``rft sft``, ``rft train`` (``cpu_kernels: avx2``, the default) and the suite pin
all three to AVX2. Set any of the variables yourself to choose otherwise. numpy, OpenBLAS and
Pillow dispatch on the CPU too, but nothing a run's numbers come from goes through them in a way that
changes a bit (``tests/trainer/test_cpu_kernels.py`` caps them as well and compares). GPU kernels
are not affected, nor is a vLLM server's oneDNN (it picks kernels of its own by the CPU anyway).
"""

from __future__ import annotations

import logging
import os
import platform

log = logging.getLogger(__name__)

AVX2_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# Names the variables pin_cpu_kernels() set, rather than the user, for the processes this one starts:
# a vLLM server lifts the oneDNN cap it finds here (policy_server/engines/vllm_server.py).
PINNED_ENV = "RFTKIT_PINNED_CPU_KERNELS"


def pin_cpu_kernels() -> None:
    """Pin torch's, MKL's and oneDNN's CPU kernels to AVX2 in this process and the ones it starts.

    Call it before the first tensor operation: torch reads its variable at its first vectorised
    kernel, MKL at its first call and oneDNN at its first primitive. Variables already set are left
    alone; other architectures (no AVX2, no MKL, no oneDNN ISA to cap) are left alone too.
    """
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return
    pinned = [name for name in AVX2_KERNELS if name not in os.environ]
    for name in pinned:
        os.environ[name] = AVX2_KERNELS[name]
    if pinned:
        os.environ[PINNED_ENV] = ",".join(pinned)
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
