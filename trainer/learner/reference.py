"""The KL reference's logprobs of one batch, kept for the batch's later optimizer passes.

The reference policy (the base model, or the warm start's frozen adapter) never changes during a run,
so a micro-batch's reference logprobs are the same on each of a batch's ``num_iterations`` passes:
TRL computes them once per generation batch. The learner computes them on the first pass and takes
them from here on the others, one forward pass fewer per micro-batch and pass. The micro-batches of
a batch are cut the same way on every pass, so a micro-batch is matched by its index and by its
sequence objects (held here, so that their ids cannot be reused). Only a pass on the very sequence
objects of the pass before takes from here: a train step on others (the next batch, or a batch
shipped afresh to a learner worker or rank) computes every micro-batch's, so the ranks of a sharded
learner, whose reference passes gather parameters from each other, all compute theirs alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from trainer.algo.sequences import TrainingSequence


class ReferenceCache:
    """Reference logprobs by micro-batch index, for the batch of the last :meth:`start`."""

    def __init__(self) -> None:
        self._batch: tuple[TrainingSequence, ...] = ()
        self._by_index: dict[int, tuple[tuple[TrainingSequence, ...], torch.Tensor]] = {}
        self._reuse = False

    def start(self, sequences: Sequence[TrainingSequence]) -> None:
        """A train step on ``sequences``: what the pass before kept is used if they are its objects."""
        self._reuse = _same(self._batch, sequences)
        if not self._reuse:
            self._batch = tuple(sequences)
            self._by_index = {}

    def logprobs(
        self, index: int, micro: Sequence[TrainingSequence], compute: Callable[[], torch.Tensor]
    ) -> torch.Tensor:
        """Micro-batch ``index``'s reference logprobs: kept from an earlier pass, else ``compute()``."""
        kept = self._by_index.get(index)
        if self._reuse and kept is not None and _same(kept[0], micro):
            return kept[1]
        logprobs = compute()
        self._by_index[index] = (tuple(micro), logprobs)
        return logprobs


def _same(ours: Sequence[TrainingSequence], theirs: Sequence[TrainingSequence]) -> bool:
    return len(ours) == len(theirs) and all(a is b for a, b in zip(ours, theirs, strict=True))
