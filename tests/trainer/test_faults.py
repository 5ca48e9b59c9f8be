"""Faults outside the trainer (docs/operations.md, the fault matrix): the agent's process SIGKILLed
with a step's rollouts in its hands, and a disk that fills up at checkpoint time. Each run is an
``rft train`` process of its own; the agent is a real BedrockAgentCoreApp on uvicorn in its own process,
as deployed, on a port that stays the same when it comes back."""

from __future__ import annotations

import errno
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.letters.run_files import write_run_files
from handlers import tied_popen
from tests.trainer.test_resume import Runs, _assert_resumed_exactly, _rft_train, _wait_for_line
from trainer.config import load_config
from trainer.learner.checkpoint import (
    CheckpointWriteError,
    RunState,
    latest_checkpoint,
    list_checkpoints,
    save_checkpoint,
)
from trainer.loop import train
from trainer.run import LOG_FILE


class AgentProcess:
    """The letters agent on uvicorn in a process of its own, on a fixed port, restartable."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        launch = (
            "import logging; from agents.letters.main import app; "
            "logging.getLogger('bedrock_agentcore.app').setLevel(logging.WARNING); "
            f"app.run(port={self.port}, host='127.0.0.1', log_level='warning')"
        )
        self.process = tied_popen([sys.executable, "-c", launch])
        deadline = time.monotonic() + 300  # bounds a hang only: a loaded machine imports slowly
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the agent exited ({self.process.returncode})"
            try:
                if httpx.get(f"{self.url}/ping", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"the agent did not answer {self.url}/ping")

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait()


@pytest.fixture(scope="module")
def agent() -> Iterator[AgentProcess]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    served = AgentProcess(port)
    served.start()
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="module")
def runs(agent: AgentProcess, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The resume tests' three-step run (test_resume.py) against the agent's own process."""
    config_path = write_run_files(
        tmp_path_factory.mktemp("faults"), tiny_model_dir, agent.url, eval_file=None, hf={"max_batch_size": 1}
    )
    return Runs(config_path, train(load_config(config_path, ["output_dir=uninterrupted"])))


def test_an_agent_killed_with_rollouts_in_flight_fails_them_by_cause_and_the_run_resumes_exactly(
    agent: AgentProcess, runs: Runs, tmp_path: Path
) -> None:
    """The agent is stopped (SIGSTOP) once step 1 is done, so every rollout of step 2 is sent to it and
    none can finish, then SIGKILLed: each fails as ``transport`` with the connection's own error text
    (after the retries), none is scored, the run stops with a sentence and exit 1 keeping step 1's
    checkpoint; with the agent back on its port, ``--resume`` ends with the uninterrupted adapter."""
    run_dir = tmp_path / "agent-killed"
    process = subprocess.Popen(_rft_train(runs.config_path, run_dir), stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_line(run_dir / LOG_FILE, "step 1: checkpoint saved", process, timeout_s=900)
        agent.signal(signal.SIGSTOP)
        _wait_for_line(run_dir / LOG_FILE, "step 2: rollouts started", process, timeout_s=60)
        time.sleep(0.5)  # the requests reach the stopped agent's socket
        agent.signal(signal.SIGKILL)
        agent.stop()
        _, err = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 1, err[-2000:]
    stop = err.strip().splitlines()[-1]
    assert stop.startswith(
        "rft train: step 2: all 8 rollouts failed, so there is nothing to train on: transport x8"
    )
    assert f"from {agent.url}/invocations" in stop and "(after 4 attempts)" in stop
    assert "(train.jsonl row" in stop
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # Never scored: the failed step has no reward, only its failures by cause with their text.
    failed = [record for record in records if record.get("step") == 2]
    assert failed and failed[-1]["failures"]["transport"] == 8
    assert "transport" in failed[-1]["failure_errors"]
    assert latest_checkpoint(run_dir / "checkpoints") == run_dir / "checkpoints" / "step-000001"
    agent.start()
    _assert_resumed_exactly(runs, run_dir)


def _checkpoint_blocks(checkpoint: Path) -> int:
    """The bytes a checkpoint takes on tmpfs (whole 4 KiB pages a file)."""
    return sum(-(-path.stat().st_size // 4096) * 4096 for path in checkpoint.rglob("*") if path.is_file())


def test_a_full_disk_at_checkpoint_time_names_the_directory_and_keeps_the_previous_checkpoint(
    runs: Runs, tmp_path: Path
) -> None:
    """A real full disk: the run's checkpoints directory is a tmpfs, in a mount namespace of its own
    (``unshare -m``, as root), with room for one checkpoint and a half, so step 2's checkpoint (written
    beside step 1's, which it replaces only once whole) meets ENOSPC. The run stops with the directory,
    the space and the way on, exit 1; what the full disk holds afterwards is copied out and resumed,
    ending with the uninterrupted adapter."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs `unshare -m` (root or CAP_SYS_ADMIN) to mount a small tmpfs of its own")
    size = _checkpoint_blocks(runs.uninterrupted.run_dir / "checkpoints" / "step-000003") * 3 // 2
    run_dir = tmp_path / "full"
    checkpoints = run_dir / "checkpoints"
    on_full_disk = tmp_path / "left-on-the-full-disk"
    checkpoints.mkdir(parents=True)
    script = (
        f"mount -t tmpfs -o size={size} tmpfs {checkpoints} && "
        f"{shlex.join(_rft_train(runs.config_path, run_dir))}; code=$?; "
        f"cp -a {checkpoints} {on_full_disk}; df -B1 {checkpoints} >&2; exit $code"
    )
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stderr[-2000:]
    lines = done.stderr.splitlines()
    stop = next(line for line in lines if line.startswith("rft train: checkpoint step-000002"))
    assert stop.startswith(
        f"rft train: checkpoint step-000002 could not be written in {checkpoints}: the filesystem is full ("
    )
    assert f" MB free of {size / 2**20:.1f} MB); the previous checkpoint" in stop
    assert f"{checkpoints / 'step-000001'} is intact (" in stop and "--resume continues from it" in stop
    # Nothing half-written is left on the full disk: step 1's checkpoint alone.
    assert sorted(path.name for path in on_full_disk.iterdir()) == ["step-000001"]
    assert "Traceback" not in done.stderr
    assert stop.removeprefix("rft train: ") in (run_dir / LOG_FILE).read_text()
    shutil.rmtree(checkpoints)
    os.rename(on_full_disk, checkpoints)
    _assert_resumed_exactly(runs, run_dir)


class _Learner:
    """Writes a small adapter, or fails its write with ``error``."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    def save_adapter(self, directory: Path) -> Path:
        directory.mkdir(parents=True)
        (directory / "adapter_model.safetensors").write_bytes(b"0" * 1000)
        if self.error is not None:
            raise self.error
        return directory

    def training_state(self) -> dict[str, Any]:
        return {}

    def restore(self, adapter_dir: Path, training_state: dict[str, Any]) -> None:
        raise AssertionError("not restored here")


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "the filesystem is full"),
        (OSError(errno.EFBIG, os.strerror(errno.EFBIG)), r"a file would pass .* \(ulimit -f\)"),
        (
            RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),
            "the filesystem is full",
        ),
    ],
    ids=["ENOSPC", "EFBIG", "safetensors"],
)
def test_every_way_a_write_finds_no_space_is_named_and_the_previous_checkpoint_kept(
    tmp_path: Path, error: Exception, reason: str
) -> None:
    """The errors the writers raise for a full disk (Python's, a file size limit's, safetensors' own
    text; torch's, which has no errno, is the full-disk test's) all give the sentence; other errors
    pass unchanged."""
    save_checkpoint(tmp_path, RunState(step=1), _Learner(), keep=2)
    with pytest.raises(
        CheckpointWriteError, match=f"checkpoint step-000002 could not be written in {tmp_path}: {reason} "
    ):
        save_checkpoint(tmp_path, RunState(step=2), _Learner(error), keep=2)
    assert list_checkpoints(tmp_path) == [tmp_path / "step-000001"]
    assert not list(tmp_path.glob(".tmp-*"))
    with pytest.raises(ValueError, match="not about space"):
        save_checkpoint(tmp_path, RunState(step=2), _Learner(ValueError("not about space")), keep=2)
