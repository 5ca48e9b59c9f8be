"""One rank of the learner's process group: :class:`LearnerWorker`, the body of a Ray learner worker
(:mod:`trainer.learner.distributed`) and of a learner process of this node
(:mod:`trainer.learner.process_worker`).

Each worker holds a :class:`~trainer.learner.rank.RankLearner`: the model whole or sharded with
FSDP2 over the group. What it hands back crosses to another process (the Ray driver, the trainer),
so tensors go back on the CPU and files as bytes: a sharded learner's checkpoint shards included,
so that the ranks need no filesystem in common (Ray's workers may sit on different nodes).
"""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer.learner.batch_images import ShippedBatch, received
from trainer.learner.group import join_group
from trainer.learner.rank import RankLearner
from trainer.learner.steps import StepResult

if TYPE_CHECKING:
    from trainer.config import TrainConfig
    from trainer.scale.placement import Placement


def to_cpu(value: Any) -> Any:
    """``value`` with every tensor in it (dicts, lists, tuples, nested) moved to the CPU, detached.

    What a worker returns crosses to the Ray driver: a CUDA tensor there cannot be unpickled without
    CUDA, and with CUDA it lands on the learner's GPU as a copy. CPU tensors are returned as they are.
    """
    if isinstance(value, torch.Tensor):
        return value.detach().cpu() if value.device.type != "cpu" else value
    if isinstance(value, dict):
        return {key: to_cpu(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_cpu(item) for item in value)
    return value


def read_files(directory: Path) -> dict[str, bytes]:
    """The files directly in ``directory`` by name (an adapter, a rank's checkpoint shards)."""
    return {path.name: path.read_bytes() for path in directory.iterdir() if path.is_file()}


def write_files(files: dict[str, bytes], directory: Path) -> Path:
    """:func:`read_files`' ``files`` written into ``directory`` (made if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return directory


class LearnerWorker:
    """One rank's learner on its device: a Ray actor (see :class:`~trainer.learner.distributed.RayLearner`),
    or the body of a learner process on this node (:mod:`trainer.learner.process_worker`).
    ``sharded``: the model is sharded with FSDP2 (:mod:`trainer.learner.rank`)."""

    def __init__(
        self,
        model_dir: str,
        config: TrainConfig,
        placement: Placement,
        rank: int,
        world: int,
        *,
        sharded: bool = False,
    ) -> None:
        self.rank, self.world, self.sharded = rank, world, sharded
        self._build = (model_dir, config, placement)
        self.learner: RankLearner  # built by join: a sharded model is split over the group as it loads

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free port for the group's TCP store (asked of rank 0)."""
        import ray

        host = ray.util.get_node_ip_address()
        with socket.socket() as probe:
            probe.bind((host, 0))
            return host, int(probe.getsockname()[1])

    def join(self, init_method: str) -> None:
        """Join the process group, build this rank's learner, and (each rank holding the whole
        model) take rank 0's adapter so every rank starts from the same one."""
        import torch.distributed as dist

        model_dir, config, placement = self._build
        device = torch.device(placement.learner_device)
        join_group(device, init_method, self.rank, self.world, config.learner.collective_timeout_s)
        self.learner = RankLearner(model_dir, config, placement, self.rank, self.world, sharded=self.sharded)
        if not self.sharded:  # sharded, every rank holds its slice of the same seeded start
            for parameter in self.learner.trainable:
                dist.broadcast(parameter.data, src=0)

    def on_pass(self, report: Callable[[], None]) -> None:
        """Call ``report`` after each micro-batch pass (the trainer's sign that this rank works)."""
        self.learner.on_pass = report

    def image_token_id(self) -> int | None:  # None for a text model
        return None if self.learner.vision is None else self.learner.vision.image_token_id

    def train_step(
        self, batch: ShippedBatch, seed: int | None, old_logprobs: list[torch.Tensor] | None
    ) -> StepResult:
        with received(batch, self.learner.images) as sequences:
            return self.learner.train_step(sequences, seed=seed, old_logprobs=old_logprobs)

    def shard_old_logprobs(self, batch: ShippedBatch) -> dict[int, torch.Tensor]:
        with received(batch, self.learner.images) as sequences:
            return to_cpu(self.learner.shard_old_logprobs(sequences))

    def adapter_files(self) -> dict[str, bytes]:
        """The adapter's peft files (sharded: every rank takes part in gathering it, rank 0's has
        them, the others' none)."""
        with tempfile.TemporaryDirectory() as directory:
            written = self.learner.save_adapter(Path(directory) / "adapter")
            return read_files(written) if written.is_dir() else {}

    def adapter_state(self) -> dict[str, torch.Tensor]:
        return to_cpu(self.learner.adapter_state())

    def training_state(self) -> dict[str, Any]:
        return to_cpu(self.learner.training_state())

    def restore(self, files: dict[str, bytes], training_state: dict[str, Any]) -> None:
        with tempfile.TemporaryDirectory() as directory:
            self.learner.restore(write_files(files, Path(directory)), training_state)

    def save_adapter(self, directory: str) -> None:
        """Write the adapter to ``directory`` (rank 0 alone where the model is sharded; every rank
        takes part in gathering it)."""
        if self.sharded or self.rank == 0:
            self.learner.save_adapter(directory)

    def save_sharded_state(self, directory: str) -> None:
        self.learner.save_sharded_state(Path(directory))

    def restore_sharded(self, directory: str, training_state: dict[str, Any]) -> None:
        self.learner.restore_sharded(Path(directory), training_state)

    def sharded_state_files(self) -> dict[str, bytes]:
        """This rank's files of :meth:`save_sharded_state` (rank 0's with the checkpoint's metadata),
        written on its own node: the files of every rank together are the sharded checkpoint."""
        with tempfile.TemporaryDirectory() as directory:
            self.learner.save_sharded_state(Path(directory))
            return read_files(Path(directory))

    def restore_sharded_files(self, files: dict[str, bytes], training_state: dict[str, Any]) -> None:
        """:meth:`restore_sharded` from a sharded checkpoint's files (every rank's), sent here."""
        with tempfile.TemporaryDirectory() as directory:
            self.learner.restore_sharded(write_files(files, Path(directory)), training_state)
