"""Atomic checkpoints: everything needed to continue a run as if it had never stopped.

A checkpoint is a directory ``step-000042`` under the run's checkpoint directory. It is written under
a temporary name, every file is fsynced, and only then renamed into place, so a run killed at any
moment leaves either the previous complete checkpoint or the new complete one, never half of one.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from trainer.errors import TrainingError

_PREFIX = "step-"
_STATE_FILE = "state.json"
_TRAINING_FILE = "training_state.pt"
_RNG_FILE = "rng.pt"
_ADAPTER_DIR = "adapter"
_SHARDED_DIR = "sharded"  # a sharded learner's LoRA weights and optimizer state, one file per rank
_ROLLOUTS_FILE = "rollouts.json"  # steps submitted but not trained on yet (asynchronous training)
_PINNED_DIR = "pinned-adapters"  # the adapters those steps' rollouts sample on


class CheckpointableLearner(Protocol):
    """What a checkpoint needs from the learner (see :class:`trainer.learner.learner.Learner`)."""

    def save_adapter(self, directory: Path) -> Path: ...

    def training_state(self) -> dict[str, Any]: ...

    def restore(self, adapter_dir: Path, training_state: dict[str, Any]) -> None: ...


@runtime_checkable
class ShardedLearnerState(Protocol):
    """A learner whose optimizer state is sharded over its processes (``sharded``): each rank writes
    and reads its part (:class:`trainer.learner.processes.ProcessLearner`)."""

    sharded: bool

    def save_sharded_state(self, directory: Path) -> None: ...

    def restore_sharded(self, directory: Path, training_state: dict[str, Any]) -> None: ...


def _sharded(learner: CheckpointableLearner) -> ShardedLearnerState | None:
    return learner if isinstance(learner, ShardedLearnerState) and learner.sharded else None


@dataclass
class DataPosition:
    """Where the run is in the training rows: the epoch, that epoch's row order, the next index."""

    epoch: int = 0
    order: list[int] = field(default_factory=list)
    index: int = 0


@dataclass
class RunState:
    """The run's bookkeeping, saved as JSON beside the tensors."""

    step: int = 0
    adapter_version: int = 0
    position: DataPosition = field(default_factory=DataPosition)
    history: list[dict[str, Any]] = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    mlflow_run_id: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunState:
        data = dict(data)
        data["position"] = DataPosition(**data.get("position", {}))
        return cls(**data)


@dataclass
class LoadedCheckpoint:
    path: Path
    state: RunState
    adapter_dir: Path
    # Asynchronous training: the steps in flight when it was written, and their adapters by version.
    in_flight: list[dict[str, Any]] = field(default_factory=list)
    pinned_adapters: dict[int, Path] = field(default_factory=dict)


def checkpoint_name(step: int) -> str:
    return f"{_PREFIX}{step:06d}"


def list_checkpoints(checkpoint_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary directories are never listed)."""
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        return []
    found = [
        path
        for path in checkpoint_dir.iterdir()
        if path.is_dir() and path.name.startswith(_PREFIX) and (path / _STATE_FILE).is_file()
    ]
    return sorted(found, key=lambda path: int(path.name[len(_PREFIX) :]))


def latest_checkpoint(checkpoint_dir: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = list_checkpoints(checkpoint_dir)
    return found[-1] if found else None


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    for directory in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]:
        _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "torch": torch.get_rng_state()}


def _restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(
    checkpoint_dir: Path,
    state: RunState,
    learner: CheckpointableLearner,
    *,
    keep: int,
    in_flight: list[dict[str, Any]] | None = None,
    pinned_adapters: dict[int, Path] | None = None,
) -> Path:
    """Write ``step-{state.step}`` atomically, then delete all but the newest ``keep`` checkpoints.

    ``in_flight`` (JSON-ready) and ``pinned_adapters`` (adapter directories by version, copied in)
    are what asynchronous training has running beyond ``state.step``.
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1 (got {keep})")
    checkpoint_dir = Path(checkpoint_dir)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir / checkpoint_name(state.step)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=checkpoint_dir))
    try:
        learner.save_adapter(tmp / _ADAPTER_DIR)
        torch.save(learner.training_state(), tmp / _TRAINING_FILE)
        sharded = _sharded(learner)
        if sharded is not None:
            sharded.save_sharded_state(tmp / _SHARDED_DIR)
        torch.save(_rng_state(), tmp / _RNG_FILE)
        (tmp / _STATE_FILE).write_text(json.dumps(asdict(state), indent=1))
        if in_flight:
            (tmp / _ROLLOUTS_FILE).write_text(json.dumps(in_flight))
        for version, directory in (pinned_adapters or {}).items():
            shutil.copytree(directory, tmp / _PINNED_DIR / f"v{version}")
        _fsync_tree(tmp)
        if final.exists():
            # Only after a crash between a previous rename and the pruning of this same step.
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(checkpoint_dir)
    except BaseException as error:
        no_space = _no_space(error, checkpoint_dir)
        shutil.rmtree(tmp, ignore_errors=True)
        if no_space is not None:
            raise CheckpointWriteError(_no_space_message(final, no_space)) from error
        raise
    for old in list_checkpoints(checkpoint_dir)[:-keep]:
        shutil.rmtree(old)
    for stale in checkpoint_dir.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return final


# A full filesystem, a spent quota, a file past the process's size limit (RLIMIT_FSIZE).
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# torch.save's zip writer reports a failed write as "unexpected pos" without the errno: a filesystem
# with less than this left when a write failed is taken to be full.
_ALMOST_FULL_BYTES = 2**20
_NO_SPACE_REASONS = {
    errno.ENOSPC: "the filesystem is full",
    errno.EDQUOT: "the disk quota is spent",
    errno.EFBIG: "a file would pass this process's file size limit (ulimit -f)",
}


class CheckpointWriteError(TrainingError):
    """A checkpoint could not be written for lack of space; the previous one is untouched."""


def _no_space(error: BaseException, directory: Path) -> str | None:
    """Why ``error`` (an OSError, safetensors' or torch's own) was a write that found no space, or None."""
    if not isinstance(error, Exception):
        return None
    codes = [code for code in _NO_SPACE if isinstance(error, OSError) and error.errno == code]
    # safetensors: "I/O error: No space left on device (os error 28)"
    codes = codes or [code for code in _NO_SPACE if os.strerror(code) in str(error)]
    if codes:
        return _NO_SPACE_REASONS[codes[0]]
    if shutil.disk_usage(directory).free < _ALMOST_FULL_BYTES:
        return _NO_SPACE_REASONS[errno.ENOSPC]
    return None


def _megabytes(size: float) -> str:
    return f"{size / 2**20:.1f} MB"


def _no_space_message(final: Path, reason: str) -> str:
    """What failed, where, the space there, and the way on (the previous checkpoint, whole)."""
    directory = final.parent
    usage = shutil.disk_usage(directory)
    previous = latest_checkpoint(directory)
    if previous is None:
        way_on = "there is no previous checkpoint: a new run starts over"
    else:
        size = sum(path.stat().st_size for path in previous.rglob("*") if path.is_file())
        way_on = (
            f"the previous checkpoint {previous} is intact ({_megabytes(size)}; the new one needs as much "
            "again beside it): free space there and --resume continues from it"
        )
    return (
        f"checkpoint {final.name} could not be written in {directory}: {reason} "
        f"({_megabytes(usage.free)} free of {_megabytes(usage.total)}); {way_on}"
    )


def _restore_learner(path: Path, learner: CheckpointableLearner, training_state: dict[str, Any]) -> None:
    """The adapter and optimizer state into ``learner``: whole, or shard by shard when a sharded
    learner wrote them (onto any number of learner processes)."""
    sharded = _sharded(learner)
    if not (path / _SHARDED_DIR).is_dir():
        if sharded is not None:
            raise TrainingError(
                f"{path} was written by an unsharded learner (learner.shard: off, or one learner in the "
                "trainer's process): resume it with the same learner settings, or start a new run to "
                "shard the learner"
            )
        learner.restore(path / _ADAPTER_DIR, training_state)
        return
    if sharded is None:
        raise TrainingError(
            f"{path} was written by a learner sharded over {training_state.get('sharded_processes')} "
            "learner process(es) (learner.shard: fsdp): resume it with learner.shard: fsdp, with any "
            "number of learner.processes"
        )
    sharded.restore_sharded(path / _SHARDED_DIR, training_state)


def load_checkpoint(path: Path, learner: CheckpointableLearner) -> LoadedCheckpoint:
    """Restore the learner (adapter, optimizer, schedule) and the RNG states; return the run state."""
    path = Path(path)
    if not (path / _STATE_FILE).is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {_STATE_FILE})")
    state = RunState.from_json(json.loads((path / _STATE_FILE).read_text()))
    # Tensors keep the device they were saved from (the optimizer state of a learner on cuda:3), which
    # the resuming process may lack: load onto the CPU; the learner's restore moves the optimizer
    # state onto its parameters' device (torch's Optimizer.load_state_dict), whichever GPU that is.
    training_state = torch.load(path / _TRAINING_FILE, map_location="cpu", weights_only=False)
    _restore_learner(path, learner, training_state)
    _restore_rng(torch.load(path / _RNG_FILE, map_location="cpu", weights_only=False))
    in_flight = []
    if (path / _ROLLOUTS_FILE).is_file():
        in_flight = json.loads((path / _ROLLOUTS_FILE).read_text())
    pinned = {}
    if (path / _PINNED_DIR).is_dir():
        pinned = {int(found.name[1:]): found for found in (path / _PINNED_DIR).glob("v*")}
    return LoadedCheckpoint(
        path=path,
        state=state,
        adapter_dir=path / _ADAPTER_DIR,
        in_flight=in_flight,
        pinned_adapters=dict(sorted(pinned.items())),
    )
