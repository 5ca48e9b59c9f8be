"""Pictures on Ray, piece by piece and without a cluster: a batch's images travel with it (read once
each from the driver's store, kept on the worker's own disk for the call), the Ray learner drops the
sequences the one-process learner drops, and a replica tells the gateway whether its model takes
images."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from policy_server import ImageStore
from policy_server.engines.ray.engine import agreed_image_token
from policy_server.engines.ray.replica import Replica
from policy_server.http.images import ImageInput, ImageLimits, ImageRef, image_from_bytes
from tests.vision_helpers import image_bytes
from trainer.algo.sequences import TrainingSequence
from trainer.learner.batch_images import received, scorable, ship

PAD = 7  # an image placeholder token


def _image(color: tuple[int, int, int]) -> ImageInput:
    return image_from_bytes(image_bytes(color), ImageLimits())


def _sequence(rollout: str, images: list[ImageInput], token_ids: list[int] | None = None) -> TrainingSequence:
    refs = [
        ImageRef(sha256=image.sha256, start=1 + 3 * index, length=2) for index, image in enumerate(images)
    ]
    return TrainingSequence(rollout, token_ids=token_ids or [1, PAD, PAD, 2, PAD, PAD, 3], images=refs)


def test_a_batch_carries_each_image_once_and_the_worker_needs_no_access_to_the_drivers_disk(
    tmp_path: Path,
) -> None:
    red, blue = _image((200, 0, 0)), _image((0, 0, 200))
    driver = ImageStore(tmp_path / "driver")
    for key, image in (("a", red), ("a", blue), ("b", red)):
        driver.put(image, key)
    sequences = [_sequence("a", [red, blue]), _sequence("b", [red]), TrainingSequence("c", token_ids=[1, 2])]

    batch = ship(sequences, driver)
    assert batch.sequences == sequences
    assert [image.sha256 for image in batch.images] == [red.sha256, blue.sha256]  # once each, in order
    # The driver's files are gone (another node never had them): the worker reads its own copies.
    driver.release("a")
    driver.release("b")
    assert len(driver) == 0 and not any((tmp_path / "driver").iterdir())
    worker = ImageStore(tmp_path / "worker")
    with received(batch, worker) as got:
        assert got == sequences
        assert worker.image(red.sha256).data == red.data and worker.image(blue.sha256).data == blue.data
    assert len(worker) == 0 and not any((tmp_path / "worker").iterdir())  # kept for the call only


def test_a_text_batch_ships_without_a_store_and_an_image_batch_without_one_says_so() -> None:
    text = [TrainingSequence("a", token_ids=[1, 2, 3])]
    assert ship(text, None).images == []
    with pytest.raises(ValueError, match="carry images, but the learner was given no image store"):
        ship([_sequence("a", [_image((0, 160, 0))])], None)


def test_a_worker_keeps_its_images_until_the_call_fails_then_drops_them(tmp_path: Path) -> None:
    image = _image((0, 160, 0))
    driver = ImageStore(tmp_path / "driver")
    driver.put(image, "a")
    worker = ImageStore(tmp_path / "worker")
    with (
        pytest.raises(RuntimeError, match="the step failed"),
        received(ship([_sequence("a", [image])], driver), worker),
    ):
        assert len(worker) == 1
        raise RuntimeError("the step failed")
    assert len(worker) == 0


def test_scorable_drops_only_sequences_whose_sampled_tokens_hold_a_placeholder() -> None:
    image = _image((200, 0, 0))
    clean = _sequence("a", [image], [1, PAD, PAD, 2, 3])
    stray = _sequence("b", [image], [1, PAD, PAD, 2, PAD])
    assert scorable([clean, stray], PAD) == [clean]
    assert scorable([clean, stray], None) == [clean, stray]  # a text model has no placeholder


class _Engine:
    """What a replica asks of its engine about images (the hf and vLLM engines' two attributes)."""

    def __init__(self, image_token_id: int | None) -> None:
        self.image_token_id = image_token_id
        self.supports_images = image_token_id is not None

    async def start(self) -> None:
        """Nothing to start."""


def test_a_replica_names_its_models_image_token_and_replicas_must_agree() -> None:
    assert asyncio.run(Replica(lambda: _Engine(PAD)).image_token_id()) == PAD
    assert asyncio.run(Replica(lambda: _Engine(None)).image_token_id()) is None
    assert agreed_image_token([PAD, PAD]) == PAD
    assert agreed_image_token([None, None]) is None
    with pytest.raises(RuntimeError, match="serve different models"):
        agreed_image_token([PAD, None])
