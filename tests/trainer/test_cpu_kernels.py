"""`rft demo` and the suite run torch's, MKL's and oneDNN's AVX2 kernels on any x86 CPU, unless told
otherwise, and compute what an AVX2-only machine computes."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from trainer.ops.cpu_kernels import AVX2_KERNELS

PROBE = (
    "import os, torch; from trainer.ops.cpu_kernels import pin_cpu_kernels; pin_cpu_kernels(); "
    "print(torch.backends.cpu.get_cpu_capability(), "
    "os.environ.get('MKL_CBWR'), os.environ.get('ONEDNN_MAX_CPU_ISA'))"
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
        assert _probe() == "AVX2 AVX2 AVX2"
    else:  # no AVX2 and no MKL to pin: nothing is set
        assert _probe().endswith(" None None")


def test_a_variable_already_set_is_left_alone() -> None:
    assert _probe(ATEN_CPU_CAPABILITY="default", MKL_CBWR="COMPATIBLE", ONEDNN_MAX_CPU_ISA="ALL") == (
        "DEFAULT COMPATIBLE ALL"
    )


# What an AVX2-only machine runs: every library in the process that picks kernels by the CPU capped
# at AVX2 by hand, named here rather than taken from the pins under test.
AVX2_MACHINE = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
    "OPENBLAS_CORETYPE": "Haswell",
}

# Two steps of the visual maze's warm start on picture demonstrations: the vision tower's patch
# embedding (a convolution, oneDNN's), its activations, the language model's matrix products and
# softmaxes (MKL's and torch's), forward and backward, and AdamW. Prints a digest of the adapter.
WARM_START = """
import hashlib, sys
from trainer.ops.cpu_kernels import pin_cpu_kernels
pin_cpu_kernels()
from agents.maze.demo.plans import TINY_TARGET_MODULES, VISION_TOWER_MODULES
from agents.maze.demonstrations import maze_demonstrations
from trainer.sft import run_sft
result = run_sft(
    sys.argv[1], maze_demonstrations(4, observation="image"), sys.argv[2], steps=2, batch_size=4,
    learning_rate=1e-3, target_modules=[*TINY_TARGET_MODULES, *VISION_TOWER_MODULES],
)
digest = hashlib.sha256()
for path in sorted(result.adapter_dir.glob("*.safetensors")):
    digest.update(path.read_bytes())
print([loss.hex() for loss in result.losses], digest.hexdigest())
"""


def _warm_start(model_dir: Path, out: Path, env: dict[str, str]) -> str:
    clean = {key: value for key, value in os.environ.items() if key not in AVX2_MACHINE}
    result = subprocess.run(
        [sys.executable, "-c", WARM_START, str(model_dir), str(out)],
        env={**clean, **env},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(not X86, reason="the pins are x86's; other CPUs keep their own kernels")
def test_the_pinned_visual_warm_start_is_what_an_avx2_only_machine_computes(
    tiny_vision_dir: Path, tmp_path: Path
) -> None:
    """On an AVX-512 machine this fails for any library the pins miss (oneDNN's convolution did)."""
    pinned = _warm_start(tiny_vision_dir, tmp_path / "pinned", {})
    capped = _warm_start(tiny_vision_dir, tmp_path / "capped", AVX2_MACHINE)
    assert pinned == capped
