"""`rft demo` and the suite run torch's and MKL's AVX2 kernels on any x86 CPU, unless told otherwise."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

from tests.conftest import REPO_ROOT
from trainer.ops.cpu_kernels import AVX2_KERNELS

PROBE = (
    "import os, torch; from trainer.ops.cpu_kernels import pin_cpu_kernels; pin_cpu_kernels(); "
    "print(torch.backends.cpu.get_cpu_capability(), os.environ.get('MKL_CBWR'))"
)

X86 = platform.machine().lower() in ("x86_64", "amd64")


def _probe(**env: str) -> str:
    clean = {key: value for key, value in os.environ.items() if key not in AVX2_KERNELS}
    result = subprocess.run(
        [sys.executable, "-c", PROBE], env={**clean, **env}, cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_a_fresh_process_is_pinned_to_avx2_on_x86_and_left_alone_elsewhere() -> None:
    if X86:
        assert _probe() == "AVX2 AVX2"
    else:  # no AVX2 and no MKL to pin: nothing is set
        assert _probe().endswith(" None")


def test_a_variable_already_set_is_left_alone() -> None:
    assert _probe(ATEN_CPU_CAPABILITY="default", MKL_CBWR="COMPATIBLE") == "DEFAULT COMPATIBLE"
