"""Data-parallel learner workers on Ray, and auto-resume of a run whose worker died.

With a ``ray`` section in the config, the learner is :class:`RayLearner`: ``ray.learner_workers``
Ray actors, each holding the model and its LoRA adapter on one device, joined in one
``torch.distributed`` group (NCCL when the learner's device is CUDA, gloo on CPU). Each worker is a
:class:`~trainer.learner.rank.RankLearner` (the micro-batches dealt round-robin, the losses scaled by
the whole batch's counts, the LoRA gradients all-reduced), so every worker clips and steps
identically and their adapters stay equal; rank 0 hands out the adapter and the optimizer state.
:class:`LearnerWorker` is also the body of a learner process on one node without Ray
(:mod:`trainer.learner.processes`), where the model may be sharded.

Files never have to be shared between nodes: adapters and optimizer state travel as bytes and tensors
through Ray, and a batch's images with the batch, so the workers may run on any node of the cluster.

A worker that dies (its process killed, its node lost) fails the step with
:class:`LearnerWorkerDied`; :func:`train_with_auto_resume` then restarts the run from its newest
checkpoint, as ``rft train --resume`` would, at most ``ray.max_learner_restarts`` times.

Ray is imported only here, and only when a ``ray`` section is configured.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import socket
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from policy_server import ImageStore
from trainer.algo.sequences import TrainingSequence
from trainer.errors import TrainingError
from trainer.learner.batch_images import ShippedBatch, received, scorable, ship
from trainer.learner.group import join_group, shards_learner
from trainer.learner.rank import RankLearner
from trainer.learner.steps import StepResult
from trainer.learner.worker_devices import wait_for_workers, worker_devices

if TYPE_CHECKING:
    from trainer.config import TrainConfig
    from trainer.scale.placement import Placement

log = logging.getLogger(__name__)
ResultT = TypeVar("ResultT")  # what one training attempt returns (trainer.run.RunSummary)

ACTOR_PREFIX = "rftkit-learner"  # learner workers are named ACTOR_PREFIX-<learner id>-<rank>
# After one worker's call failed, how long to wait for the others' before deciding which died (a
# survivor whose all-reduce peer vanished fails at once; one that would hang is killed after this).
_SETTLE_S = 20.0


class LearnerWorkerDied(RuntimeError):
    """A learner worker's actor died (killed, out of memory, its node lost) during a call."""

    def __init__(self, rank: int, workers: int, actor: str, cause: str) -> None:
        super().__init__(f"learner worker {rank} of {workers} (Ray actor {actor}) died: {cause}")
        self.rank = rank
        self.actor = actor


def worker_device(learner_device: str) -> str:
    """The torch device of a learner worker chosen to train on ``learner_device`` (a CUDA device or not).

    Ray gives each CUDA worker one GPU of its own (CUDA_VISIBLE_DEVICES), so its first device,
    ``cuda:0``: with an index, which ``torch.cuda.set_device`` needs (it refuses a bare ``cuda``).
    """
    return "cuda:0" if learner_device.startswith("cuda") else "cpu"


def alive_node_resources() -> list[dict[str, float]]:
    """The resources (``GPU``, ``CPU``, custom ones) of every alive node of the connected Ray cluster."""
    import ray

    return [dict(node["Resources"]) for node in ray.nodes() if node.get("Alive")]


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


def _adapter_files(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in directory.iterdir() if path.is_file()}


def _write_files(files: dict[str, bytes], directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return directory


class LearnerWorker:
    """One rank's learner on its device: a Ray actor (see :class:`RayLearner`), or the body of a
    learner process on this node (:mod:`trainer.learner.process_worker`). ``sharded``: the model is
    sharded with FSDP2 (:mod:`trainer.learner.rank`)."""

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
        with tempfile.TemporaryDirectory() as directory:
            return _adapter_files(self.learner.save_adapter(Path(directory) / "adapter"))

    def adapter_state(self) -> dict[str, torch.Tensor]:
        return to_cpu(self.learner.adapter_state())

    def training_state(self) -> dict[str, Any]:
        return to_cpu(self.learner.training_state())

    def restore(self, files: dict[str, bytes], training_state: dict[str, Any]) -> None:
        with tempfile.TemporaryDirectory() as directory:
            self.learner.restore(_write_files(files, Path(directory)), training_state)

    def save_adapter(self, directory: str) -> None:
        """Write the adapter to ``directory`` (rank 0 alone where the model is sharded; every rank
        takes part in gathering it)."""
        if self.sharded or self.rank == 0:
            self.learner.save_adapter(directory)

    def save_sharded_state(self, directory: str) -> None:
        self.learner.save_sharded_state(Path(directory))

    def restore_sharded(self, directory: str, training_state: dict[str, Any]) -> None:
        self.learner.restore_sharded(Path(directory), training_state)


class RayLearner:
    """The learner of :mod:`trainer.learner.learner` as ``ray.learner_workers`` data-parallel Ray actors.

    The same methods as :class:`~trainer.learner.learner.Learner` that the loop and checkpoints use; each
    call goes to every worker (whose results agree) and a worker's death raises
    :class:`LearnerWorkerDied` after all of them are stopped. ``image_store``: the run's images, read
    here and sent to the workers with each batch (:mod:`trainer.learner.batch_images`).
    """

    def __init__(
        self,
        model_dir: str | Path,
        config: TrainConfig,
        *,
        placement: Placement | None = None,
        image_store: ImageStore | None = None,
    ) -> None:
        import ray

        from trainer.scale.placement import detect_gpus, node_for, place

        settings = config.ray
        if settings is None:
            raise ValueError("RayLearner needs the config's ray section")
        if shards_learner(config):
            raise TrainingError(
                "learner.shard: fsdp with a ray section is not built yet (a sharded checkpoint needs a "
                "filesystem every learner worker's node shares): set learner.shard: off for data-parallel "
                "Ray learner workers, or drop the ray section to shard the learner over this node's "
                "learner processes (learner.processes)"
            )
        placement = placement or place(config, node_for(config, detect_gpus()))
        # The workers' device comes from the cluster's nodes: the driver may sit on a GPU-less head.
        chosen = worker_devices(config, alive_node_resources())
        (log.warning if chosen.short_of_gpus else log.info)("%s", chosen.reason)
        cuda = chosen.device == "cuda"
        placed = dataclasses.replace(
            placement, learner_device=worker_device(chosen.device), learner_dtype=chosen.dtype
        )
        self.id, self.image_store = uuid.uuid4().hex[:8], image_store
        world = settings.learner_workers
        self.names = [f"{ACTOR_PREFIX}-{self.id}-{rank}" for rank in range(world)]
        actor = ray.remote(LearnerWorker)
        self.workers: list[Any] = [  # Ray actor handles
            actor.options(
                name=name,
                num_cpus=settings.learner_num_cpus,
                num_gpus=chosen.gpus_each,
                resources=settings.learner_resources,
                max_restarts=0,
            ).remote(str(model_dir), config, placed, rank, world)
            for rank, name in enumerate(self.names)
        ]
        wait_for_workers(self.workers, config, chosen, alive_node_resources)
        host, port = self._call([self.workers[0].rendezvous.remote()])[0]
        self._call([worker.join.remote(f"tcp://{host}:{port}") for worker in self.workers])
        self.image_token_id: int | None = self._call([self.workers[0].image_token_id.remote()])[0]
        log.info("%d learner workers joined (%s backend)", world, "nccl" if cuda else "gloo")

    def train_step(
        self,
        sequences: Sequence[TrainingSequence],
        *,
        seed: int | None = None,
        old_logprobs: Sequence[torch.Tensor] | None = None,
    ) -> StepResult:
        """One optimizer step on every worker (see :meth:`trainer.learner.learner.Learner.train_step`).

        The batch goes into Ray's object store once, with its images, and every worker gets a
        reference to it (Ray would otherwise serialize a copy per call)."""
        import ray

        batch = ray.put(ship(sequences, self.image_store))
        old = None if old_logprobs is None else ray.put(list(old_logprobs))
        return self._call([worker.train_step.remote(batch, seed, old) for worker in self.workers])[0]

    def scorable(self, sequences: Sequence[TrainingSequence]) -> list[TrainingSequence]:
        """As the one-process learner's (:func:`trainer.learner.batch_images.scorable`)."""
        return scorable(sequences, self.image_token_id)

    def old_logprobs(self, sequences: Sequence[TrainingSequence]) -> list[torch.Tensor]:
        """Each worker's share of :meth:`trainer.learner.learner.Learner.old_logprobs`, put together."""
        import ray

        batch = ray.put(ship(sequences, self.image_store))  # once, for every worker
        merged: dict[int, torch.Tensor] = {}
        for part in self._call([worker.shard_old_logprobs.remote(batch) for worker in self.workers]):
            merged.update(part)
        return [merged[position] for position in range(len(sequences))]

    def save_adapter(self, directory: str | Path) -> Path:
        """Rank 0's adapter, written in peft format to ``directory`` on this machine."""
        return _write_files(self._call([self.workers[0].adapter_files.remote()])[0], Path(directory))

    def adapter_state(self) -> dict[str, torch.Tensor]:
        return self._call([self.workers[0].adapter_state.remote()])[0]

    def training_state(self) -> dict[str, Any]:
        return self._call([self.workers[0].training_state.remote()])[0]

    def restore(self, adapter_dir: str | Path, training_state: dict[str, Any]) -> None:
        """Every worker loads the adapter in ``adapter_dir`` (read here) and the training state."""
        files = _adapter_files(Path(adapter_dir))
        self._call([worker.restore.remote(files, training_state) for worker in self.workers])

    def close(self) -> None:
        """Stop every worker (a survivor may be blocked in a collective its dead peer never joins)."""
        import ray

        for worker in self.workers:
            ray.kill(worker, no_restart=True)

    def _call(self, refs: list[Any]) -> list[Any]:
        """Results of one call per worker (ranks in order); on a failure, stop all workers and raise
        :class:`LearnerWorkerDied` when one of them died, else the failure itself."""
        import ray
        from ray.exceptions import RayActorError

        results: list[Any] = [None] * len(refs)
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                results[rank_of[ready[0]]] = ray.get(ready[0])
            except Exception as error:
                rank = rank_of[ready[0]]
                died: Exception | None = error if isinstance(error, RayActorError) else None
                if died is None:
                    rank, died = self._first_death(pending, rank_of) or (rank, None)
                self.close()
                if died is None:
                    raise
                cause = _first_line(died)
                raise LearnerWorkerDied(rank, len(self.workers), self.names[rank], cause) from error
        return results

    def _first_death(self, pending: list[Any], rank_of: dict[Any, int]) -> tuple[int, Exception] | None:
        """Of the calls still pending, the first that failed because its actor died, if any."""
        import ray
        from ray.exceptions import RayActorError

        if not pending:
            return None
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=_SETTLE_S)
        for ref in sorted(ready, key=rank_of.__getitem__):
            try:
                ray.get(ref)
            except RayActorError as error:
                return rank_of[ref], error
            except Exception:  # a survivor's own failure: the peer's death caused it
                continue
        return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def train_with_auto_resume(
    config: TrainConfig, resume: bool, train_once: Callable[[TrainConfig, bool], ResultT]
) -> ResultT:
    """``train_once(config, resume)`` on the connected Ray cluster (:mod:`trainer.scale.ray_cluster`),
    restarted from the newest checkpoint (from the start before the first one) each time a learner
    worker dies, at most ``ray.max_learner_restarts`` times; then a
    :class:`~trainer.errors.TrainingError` naming the workers that died and how often."""
    from trainer.learner.checkpoint import latest_checkpoint
    from trainer.ops.metrics import METRICS_FILE

    settings = config.ray
    assert settings is not None  # only called with a ray section
    deaths: collections.Counter[str] = collections.Counter()
    while True:
        try:
            return train_once(config, resume)
        except LearnerWorkerDied as died:
            deaths[f"worker {died.rank}"] += 1
            restarts = sum(deaths.values()) - 1
            if restarts >= settings.max_learner_restarts:
                counts = ", ".join(f"{who}: {count}" for who, count in sorted(deaths.items()))
                raise TrainingError(
                    f"learner workers died {sum(deaths.values())} time(s) ({counts}); gave up after "
                    f"{restarts} auto-resume(s) (ray.max_learner_restarts = "
                    f"{settings.max_learner_restarts}). Last: {died}"
                ) from died
            resume = latest_checkpoint(config.output_dir / "checkpoints") is not None
            if not resume:  # starting over: the failed attempt's step records go with it
                (config.output_dir / METRICS_FILE).unlink(missing_ok=True)
            log.warning(
                "%s; auto-resume %d of %d from %s",
                died,
                restarts + 1,
                settings.max_learner_restarts,
                "the newest checkpoint" if resume else "the start (no checkpoint yet)",
            )
