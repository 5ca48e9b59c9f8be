"""A batch's images on the learner side: which sequences a vision-language learner can score, and the
images that travel with a batch to Ray learner workers, which may share no disk with the driver.

The run's image store (:class:`policy_server.ImageStore`) is a directory on the driver's disk, where
the gateway put each call's images; a learner worker on another node cannot read it. So
:class:`~trainer.learner.distributed.RayLearner` reads each distinct image of a batch's sequences
from that store on the driver (:func:`ship`) and puts them, with the sequences, into Ray's object store
as one :class:`ShippedBatch` (one copy per node, whatever the number of workers there). Each worker
keeps them in an image store of its own, a temporary directory on its node, for the call
(:func:`received`), where its learner reads them as the one-process learner reads the run's store.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainer.algo.sequences import TrainingSequence
from trainer.learner.vision import stray_placeholders

if TYPE_CHECKING:
    from policy_server import ImageInput, ImageStore

_CALL_KEY = "learner-call"  # what a worker's store files the images of the call in progress under


@dataclass(frozen=True)
class ShippedBatch:
    """A batch's sequences and, once each, the images they show (what a learner worker is sent)."""

    sequences: list[TrainingSequence]
    images: list[ImageInput]


def ship(sequences: Sequence[TrainingSequence], store: ImageStore | None) -> ShippedBatch:
    """``sequences`` with their images read from ``store`` (each distinct image once, hash-checked)."""
    wanted = dict.fromkeys(ref.sha256 for sequence in sequences for ref in sequence.images)
    if not wanted:
        return ShippedBatch(list(sequences), [])
    if store is None:
        raise ValueError("these sequences carry images, but the learner was given no image store")
    return ShippedBatch(list(sequences), [store.image(sha256) for sha256 in wanted])


@contextmanager
def received(batch: ShippedBatch, store: ImageStore) -> Iterator[list[TrainingSequence]]:
    """The batch's sequences, with its images in ``store`` (the worker's own) until the block ends."""
    for image in batch.images:
        store.put(image, _CALL_KEY)
    try:
        yield batch.sequences
    finally:
        store.release(_CALL_KEY)


def scorable(sequences: Sequence[TrainingSequence], image_token_id: int | None) -> list[TrainingSequence]:
    """The sequences a learner can score exactly: for a vision-language model (``image_token_id`` set),
    those without an image placeholder the policy sampled
    (:func:`trainer.learner.vision.stray_placeholders`); all of them for a text model."""
    if image_token_id is None:
        return list(sequences)
    return [sequence for sequence in sequences if not stray_placeholders(sequence, image_token_id)]
