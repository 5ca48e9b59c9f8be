"""bench/device_pack.sh: the wheels it leaves in .whl/ install offline for CPython 3.12.

The offline check (``--check``) needs no registry but needs the wheels: it runs when ``.whl/`` holds
a pack (bench/device_pack.sh downloaded it once, e.g. before a device call), and is skipped
otherwise, with the reason, so the suite never depends on a registry. Set RFTKIT_DEVICE_PACK=1 to
download the pack first (cached in .whl/ afterwards).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "device_pack.sh"
HAS_PACK = any((REPO / ".whl").glob("*.whl"))
DOWNLOAD = os.environ.get("RFTKIT_DEVICE_PACK") == "1"


@pytest.mark.skipif(
    not (HAS_PACK or DOWNLOAD), reason="no .whl/ pack here: run bench/device_pack.sh (needs a registry) first"
)
def test_the_pack_installs_offline_for_python_3_12() -> None:
    if DOWNLOAD:
        subprocess.run(["bash", str(SCRIPT)], cwd=REPO, check=True, timeout=600)
    done = subprocess.run(
        ["bash", str(SCRIPT), "--check"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "installable offline for CPython 3.12" in done.stdout
    mib = float(done.stdout.rsplit(" MiB", 1)[0].rsplit(" ", 1)[1])
    assert mib <= 48


def test_a_missing_pack_fails_with_a_sentence(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT), "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DEST": str(tmp_path / "none")},
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"device_pack: {tmp_path / 'none'}/ does not exist: run bench/device_pack.sh (without --check) first"
    )
