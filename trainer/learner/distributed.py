"""Data-parallel learner workers on Ray, and auto-resume of a run whose worker died.

With a ``ray`` section in the config, the learner is :class:`RayLearner`: ``ray.learner_workers``
Ray actors, each holding the model and its LoRA adapter on one device, joined in one
``torch.distributed`` group (NCCL when the learner's device is CUDA, gloo on CPU; rendezvous on
the first worker's node address and a free port). Each worker is a
:class:`~trainer.learner.worker.LearnerWorker` holding a :class:`~trainer.learner.rank.RankLearner`
(the micro-batches dealt round-robin, the losses scaled by the whole batch's counts), as a learner
process of one node without Ray is (:mod:`trainer.learner.processes`). With ``learner.shard: off``
every worker holds the whole model, the LoRA gradients are all-reduced, every worker clips and steps
identically and rank 0 hands out the adapter and the optimizer state. With ``learner.shard: fsdp``
each worker holds an FSDP2 shard of the frozen base and of the adapter: every worker takes part in
gathering the adapter (rank 0 hands it out), and a checkpoint holds each worker's shard of the
optimizer state.

Files never have to be shared between nodes: adapters, optimizer state and a sharded checkpoint's
files travel as bytes and tensors through Ray, and a batch's images with the batch, so the workers
may run on any node of the cluster.

A worker that dies (its process killed, its node lost) fails the step with
:class:`LearnerWorkerDied`; :func:`train_with_auto_resume` then restarts the run from its newest
checkpoint, as ``rft train --resume`` would, at most ``ray.max_learner_restarts`` times.

Ray is imported only here, and only when a ``ray`` section is configured.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from policy_server import ImageStore
from trainer.algo.sequences import TrainingSequence
from trainer.errors import TrainingError
from trainer.learner.batch_images import scorable, ship
from trainer.learner.group import shards_learner
from trainer.learner.steps import StepResult
from trainer.learner.worker import LearnerWorker, read_files, write_files
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
        placement = placement or place(config, node_for(config, detect_gpus()))
        # The workers' device comes from the cluster's nodes: the driver may sit on a GPU-less head.
        chosen = worker_devices(config, alive_node_resources())
        (log.warning if chosen.short_of_gpus else log.info)("%s", chosen.reason)
        cuda = chosen.device == "cuda"
        placed = dataclasses.replace(
            placement, learner_device=worker_device(chosen.device), learner_dtype=chosen.dtype
        )
        self.id, self.image_store = uuid.uuid4().hex[:8], image_store
        world, self.sharded = settings.learner_workers, shards_learner(config)
        self.names = [f"{ACTOR_PREFIX}-{self.id}-{rank}" for rank in range(world)]
        actor = ray.remote(LearnerWorker)
        self.workers: list[Any] = [  # Ray actor handles
            actor.options(
                name=name,
                num_cpus=settings.learner_num_cpus,
                num_gpus=chosen.gpus_each,
                resources=settings.learner_resources,
                max_restarts=0,
            ).remote(str(model_dir), config, placed, rank, world, sharded=self.sharded)
            for rank, name in enumerate(self.names)
        ]
        wait_for_workers(self.workers, config, chosen, alive_node_resources)
        host, port = self._call([self.workers[0].rendezvous.remote()])[0]
        self._call([worker.join.remote(f"tcp://{host}:{port}") for worker in self.workers])
        self.image_token_id: int | None = self._call([self.workers[0].image_token_id.remote()])[0]
        how = "sharded with FSDP2" if self.sharded else "each holding the whole model"
        log.info("%d learner workers joined (%s backend), %s", world, "nccl" if cuda else "gloo", how)

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
        return write_files(self._first("adapter_files"), Path(directory))

    def adapter_state(self) -> dict[str, torch.Tensor]:
        result: dict[str, torch.Tensor] = self._first("adapter_state")
        return result

    def training_state(self) -> dict[str, Any]:
        return self._call([self.workers[0].training_state.remote()])[0]

    def restore(self, adapter_dir: str | Path, training_state: dict[str, Any]) -> None:
        """Every worker loads the adapter in ``adapter_dir`` (read here) and the training state."""
        files = read_files(Path(adapter_dir))
        self._call([worker.restore.remote(files, training_state) for worker in self.workers])

    def save_sharded_state(self, directory: Path) -> None:
        """Every worker's shard of the LoRA weights and the optimizer state, written to ``directory``
        on this machine (each worker's files come through Ray: no filesystem in common needed)."""
        if not self.sharded:  # every worker holds the same state: the training state has it whole
            return
        for files in self._call([worker.sharded_state_files.remote() for worker in self.workers]):
            write_files(files, Path(directory))

    def restore_sharded(self, directory: Path, training_state: dict[str, Any]) -> None:
        """Every worker reads its shard of a sharded checkpoint (written by any number of ranks)."""
        import ray

        files = ray.put(read_files(Path(directory)))  # once, for every worker
        self._call([worker.restore_sharded_files.remote(files, training_state) for worker in self.workers])

    def _first(self, method: str) -> Any:
        """Rank 0's result of ``method``: asked of rank 0 alone where every worker holds the whole
        model, of every worker where the model is sharded (gathering it is a collective)."""
        workers = self.workers if self.sharded else self.workers[:1]
        return self._call([getattr(worker, method).remote() for worker in workers])[0]

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
