"""The learner as ``learner.processes`` processes on this node, without Ray: :class:`ProcessLearner`.

The trainer starts each learner process itself (:func:`handlers.processes.tied_popen` of
:mod:`trainer.learner.process_worker`, so none outlives it), one device each, joined in one
``torch.distributed`` group (NCCL on GPUs, gloo on CPU, rendezvous through a file). Every rank is a
learner process, rank 0 included; the trainer's own process holds no part of the model. So the
trainer never waits inside a collective: it sends each call to every rank over a socket pair and
watches the answers and the processes, which is how it names a rank that died (its process ended)
or hung (the others' collectives gave up after ``learner.collective_timeout_s`` and it never
answered). Every rank hung at once leaves no rank to give up: a working rank reports each
micro-batch pass, a rank waiting in a collective answers within the collective timeout, so a call
during which no rank is heard from for ``learner.collective_timeout_s`` plus a margin ends naming
the ranks that did not answer (loading the model, before the first call, is not bounded). On the
GPU the trainer keeps no CUDA context of the learner's, and the learner's memory is the learner
processes' alone.

Each rank runs the Ray learner worker's body (:class:`trainer.learner.worker.LearnerWorker`):
the micro-batches dealt round-robin, the model whole (``learner.shard: off``, gradients all-reduced)
or sharded with FSDP2 (``fsdp``, :mod:`trainer.learner.rank`). A sharded learner's checkpoint holds
its optimizer state as each rank's shard (torch's distributed checkpoint), written by every rank
into the checkpoint directory this node shares.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from handlers import tied_popen
from trainer.algo.sequences import TrainingSequence
from trainer.errors import TrainingError
from trainer.learner.batch_images import scorable as scorable_sequences
from trainer.learner.batch_images import ship
from trainer.learner.group import process_devices, shards_learner
from trainer.learner.process_worker import FD_VARIABLE, send
from trainer.learner.rank_processes import RankProcesses
from trainer.learner.steps import StepResult

if TYPE_CHECKING:
    from policy_server import ImageStore
    from trainer.config import TrainConfig
    from trainer.scale.placement import Placement

log = logging.getLogger(__name__)


class ProcessLearner:
    """The methods of :class:`~trainer.learner.learner.Learner` that the loop and checkpoints use,
    each run by every learner process. ``image_store``: the run's images, sent with each batch."""

    def __init__(
        self,
        model_dir: str | Path,
        config: TrainConfig,
        *,
        placement: Placement | None = None,
        image_store: ImageStore | None = None,
    ) -> None:
        import dataclasses

        from trainer.scale.placement import detect_gpus, node_for, place

        placement = placement or place(config, node_for(config, detect_gpus()))
        devices = process_devices(config, placement)
        self.world, self.sharded, self.image_store = len(devices), shards_learner(config), image_store
        self._rendezvous = Path(tempfile.mkdtemp(prefix="rftkit-learner-"))
        self.connections: list[Connection] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        for rank, device in enumerate(devices):
            ours, theirs = multiprocessing.Pipe()
            env = {**os.environ, FD_VARIABLE: str(theirs.fileno())}
            command = [sys.executable, "-m", "trainer.learner.process_worker"]
            self.processes.append(tied_popen(command, env=env, pass_fds=(theirs.fileno(),)))
            theirs.close()
            self.connections.append(ours)
            placed = dataclasses.replace(placement, learner_device=device)
            init = f"file://{self._rendezvous / 'store'}"
            send(ours, (rank, self.world, init, str(model_dir), config, placed, self.sharded))
        self.ranks = RankProcesses(self.processes, self.connections, config.learner.collective_timeout_s)
        # Not bounded: loading a large model takes what it takes.
        self.pids = self._answers(lambda: self.ranks.gather("start", bounded=False))
        self.image_token_id: int | None = self._call("image_token_id")[0]
        how = "sharded with FSDP2" if self.sharded else "each holding the whole model"
        log.info("%d learner processes joined (%s), %s", self.world, ", ".join(devices), how)

    def train_step(
        self,
        sequences: Sequence[TrainingSequence],
        *,
        seed: int | None = None,
        old_logprobs: Sequence[torch.Tensor] | None = None,
    ) -> StepResult:
        """One optimizer step on every rank (see :meth:`trainer.learner.learner.Learner.train_step`)."""
        old = None if old_logprobs is None else list(old_logprobs)
        return self._call("train_step", ship(sequences, self.image_store), seed, old)[0]

    def scorable(self, sequences: Sequence[TrainingSequence]) -> list[TrainingSequence]:
        """As the one-process learner's (:func:`trainer.learner.batch_images.scorable`)."""
        return scorable_sequences(sequences, self.image_token_id)

    def old_logprobs(self, sequences: Sequence[TrainingSequence]) -> list[torch.Tensor]:
        """Each rank's share of :meth:`trainer.learner.learner.Learner.old_logprobs`, put together."""
        merged: dict[int, torch.Tensor] = {}
        for part in self._call("shard_old_logprobs", ship(sequences, self.image_store)):
            merged.update(part)
        return [merged[position] for position in range(len(sequences))]

    def save_adapter(self, directory: str | Path) -> Path:
        """The adapter in peft format in ``directory`` (written by rank 0, on this node)."""
        self._call("save_adapter", str(directory))
        return Path(directory)

    def adapter_state(self) -> dict[str, torch.Tensor]:
        result: dict[str, torch.Tensor] = self._call("adapter_state")[0]
        return result

    def training_state(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("training_state")[0]
        return result

    def restore(self, adapter_dir: str | Path, training_state: dict[str, Any]) -> None:
        """Every rank loads an unsharded checkpoint's adapter and training state."""
        files = {path.name: path.read_bytes() for path in Path(adapter_dir).iterdir() if path.is_file()}
        self._call("restore", files, training_state)

    def save_sharded_state(self, directory: Path) -> None:
        """Every rank writes its shard of the LoRA weights and the optimizer state to ``directory``."""
        if not self.sharded:  # every rank holds the same state: the training state has it whole
            return
        self._call("save_sharded_state", str(directory))

    def restore_sharded(self, directory: Path, training_state: dict[str, Any]) -> None:
        """Every rank reads its shard of a sharded checkpoint (written by any number of ranks)."""
        self._call("restore_sharded", str(directory), training_state)

    def close(self) -> None:
        """Ask every learner process to exit; kill the ones that do not within a few seconds."""
        self.ranks.stop()
        shutil.rmtree(self._rendezvous, ignore_errors=True)

    def _call(self, method: str, *args: Any) -> list[Any]:
        """``method(*args)`` on every rank; their results, rank order (see :class:`RankProcesses`)."""
        return self._answers(lambda: self.ranks.call(method, *args))

    def _answers(self, gather: Callable[[], list[Any]]) -> list[Any]:
        try:
            return gather()
        except TrainingError:  # the processes are stopped: their rendezvous goes too
            shutil.rmtree(self._rendezvous, ignore_errors=True)
            raise
