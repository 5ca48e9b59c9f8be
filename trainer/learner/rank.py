"""One rank of a learner process group (a Ray learner worker or a learner process of this node).

A step's micro-batches are dealt out round-robin (micro-batch i to rank i mod N) and each rank
scales its micro-batches' losses by the *whole* batch's episode and token counts (as the one-process
learner does for gradient accumulation, see :func:`trainer.algo.grpo.grpo_loss`), so the **sum** of
the ranks' LoRA gradients is the one-process gradient of the whole batch. Each micro-batch draws its
dropout from its own seed, so which rank computes it changes nothing.

Two ways to hold the model (``learner.shard``):

- ``off`` (plain data parallel): every rank holds the whole model; after the backward passes the
  LoRA gradients are all-reduced in one flat sum, and every rank clips and steps identically, so
  their adapters stay equal.
- ``fsdp``: every rank holds a shard of the frozen base and of the LoRA weights
  (:mod:`trainer.learner.fsdp`); gradients are reduce-scattered as each backward ends, AdamW steps
  on the shards. Every rank must run the same collectives, so a rank dealt fewer micro-batches than
  another runs extra passes (on a micro-batch of the step, loss times zero) that only keep it in step.
  The adapter is gathered whole to publish it; checkpoints hold the sharded optimizer state.

After each micro-batch pass a rank calls ``on_pass``: a learner process tells the trainer it is
still working (:mod:`trainer.learner.rank_processes` bounds its wait by these signs).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from policy_server import ImageStore
from trainer.algo.sequences import TrainingSequence
from trainer.learner.learner import Learner
from trainer.learner.model import TRAINED_ADAPTER
from trainer.learner.steps import GradientSums, StepTotals

if TYPE_CHECKING:
    from trainer.config import TrainConfig
    from trainer.scale.placement import Placement

PADDING = -1  # the index of a pass that only keeps a sharded rank's collectives in step


class RankLearner(Learner):
    """One rank: its share of the micro-batches; the model whole (``sharded`` False) or sharded."""

    def __init__(
        self,
        model_dir: str | Path,
        config: TrainConfig,
        placement: Placement,
        rank: int,
        world: int,
        *,
        sharded: bool,
    ) -> None:
        self.rank, self.world, self.sharded = rank, world, sharded
        self.on_pass: Callable[[], None] = _nothing  # called after each micro-batch pass
        self._root: torch.nn.Module | None = None
        # The images of the call in progress, on this rank's node (the driver's may be out of reach).
        self.images = ImageStore.temporary()
        super().__init__(model_dir, config, placement=placement, image_store=self.images)

    def _load_device(self) -> torch.device:
        # Sharded, the base is loaded on the CPU and each FSDP unit moves its shard to this rank's
        # GPU as it is sharded: the GPU never holds the whole base (it may not fit one GPU).
        return torch.device("cpu") if self.sharded else self.device

    def _distribute(self) -> None:
        if self.sharded:
            from trainer.learner.fsdp import shard_model

            self._root = shard_model(self.model, functools.partial(Learner.token_logprobs, self), self.device)

    def token_logprobs(
        self, batch: Any, vision: dict[str, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._root is None:
            return super().token_logprobs(batch, vision)
        return self._root(batch, vision)

    def _shard(
        self, micro_batches: list[list[TrainingSequence]]
    ) -> Iterator[tuple[int, list[TrainingSequence]]]:
        for dealt in self._dealt(micro_batches):
            yield dealt
            self.on_pass()  # the pass is done (the loop asks for the next one)

    def _dealt(self, micro_batches: list[list[TrainingSequence]]) -> list[tuple[int, list[TrainingSequence]]]:
        mine = [(index, micro_batches[index]) for index in range(self.rank, len(micro_batches), self.world)]
        if not self.sharded or not micro_batches:
            return mine
        passes = -(-len(micro_batches) // self.world)  # the most any rank is dealt
        smallest = min(micro_batches, key=lambda micro: sum(len(sequence) for sequence in micro))
        return mine + [(PADDING, smallest)] * (passes - len(mine))

    def _accumulate(
        self,
        micro_batches: list[list[TrainingSequence]],
        old_by_sequence: dict[int, torch.Tensor] | None,
        totals: StepTotals,
        seed: int | None,
    ) -> GradientSums:
        if not self.sharded:
            return super()._accumulate(micro_batches, old_by_sequence, totals, seed)
        # Every pass runs its backward, even after a non-finite loss (the step is then skipped on
        # every rank): its reduce-scatters are what the other ranks wait for.
        sums = GradientSums()
        for index, micro in self._shard(micro_batches):
            loss, metrics, tokens = self._micro_loss(micro, index, old_by_sequence, totals, seed)
            if index == PADDING:
                (loss * 0.0).backward()
                continue
            finite = bool(torch.isfinite(loss))
            sums.finite = sums.finite and finite
            loss.backward()
            if finite:
                sums.add(float(loss.detach()), metrics, tokens)
        return sums

    def _combine(self, sums: GradientSums) -> GradientSums:
        import torch.distributed as dist

        gathered: list[GradientSums | None] = [None] * self.world
        dist.all_gather_object(gathered, sums)
        total = GradientSums()
        for part in gathered:
            assert part is not None  # all_gather_object fills every slot
            total.merge(part)
        # Sharded, the backward passes reduce-scattered the gradients already.
        if total.finite and not self.sharded:  # every rank decides alike: all reduce, or none does
            _all_reduce_sum(self.trainable)
        return total

    def adapter_state(self) -> dict[str, torch.Tensor]:
        if not self.sharded:
            return super().adapter_state()
        from peft import get_peft_model_state_dict

        from trainer.learner.fsdp import full_adapter_state

        state = get_peft_model_state_dict(self.model, state_dict=full_adapter_state(self.model))
        return {name: tensor.clone() for name, tensor in state.items()}

    def save_adapter(self, directory: str | Path) -> Path:
        """The adapter in peft format, gathered whole from the shards and written by rank 0 alone."""
        if not self.sharded:
            return super().save_adapter(directory)
        from trainer.learner.fsdp import full_adapter_state

        full = full_adapter_state(self.model)  # every rank takes part in the gathering
        directory = Path(directory)
        if self.rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(
                str(directory),
                selected_adapters=[TRAINED_ADAPTER],
                save_embedding_layers=False,
                state_dict=full,
            )
        return directory

    def training_state(self) -> dict[str, Any]:
        if not self.sharded:
            return super().training_state()
        # The optimizer's state is sharded: save_sharded_state writes it, each rank its part.
        return {
            "scheduler": self.scheduler.state_dict(),
            "steps_done": self.steps_done,
            "steps_skipped": self.steps_skipped,
            "sharded_processes": self.world,
        }

    def save_sharded_state(self, directory: Path) -> None:
        from trainer.learner.fsdp import save_sharded_state

        save_sharded_state(self.model, self.optimizer, directory)

    def restore_sharded(self, directory: Path, training_state: dict[str, Any]) -> None:
        """The LoRA weights and optimizer state of :meth:`save_sharded_state`, on any number of ranks."""
        from trainer.learner.fsdp import load_sharded_state

        load_sharded_state(self.model, self.optimizer, directory)
        self.scheduler.load_state_dict(training_state["scheduler"])
        self.steps_done = int(training_state["steps_done"])
        self.steps_skipped = int(training_state["steps_skipped"])


def _nothing() -> None:
    """``on_pass`` where nobody listens (a Ray learner worker)."""


def _all_reduce_sum(parameters: Sequence[torch.Tensor]) -> None:
    """Sum every rank's gradients of ``parameters`` in one flat all-reduce (a rank without
    micro-batches adds zeros)."""
    import torch.distributed as dist

    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
    flat = torch.cat([grad.reshape(-1) for grad in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for parameter in parameters:
        parameter.grad = flat[offset : offset + parameter.numel()].view_as(parameter)
        offset += parameter.numel()
