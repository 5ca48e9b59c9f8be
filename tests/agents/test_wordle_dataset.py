"""The Wordle dataset: sizes, disjoint splits, seeding, rows that carry only the secret."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.wordle.dataset import TRAIN_SIZE, VALIDATION_SIZE, main, split_secrets
from agents.wordle.word_lists import answers


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_cli_writes_640_train_and_128_validation_rows_of_only_the_secret(tmp_path: Path) -> None:
    assert main([str(tmp_path / "data"), "--seed", "7"]) == 0
    train = read_rows(tmp_path / "data" / "train.jsonl")
    validation = read_rows(tmp_path / "data" / "validation.jsonl")
    assert (len(train), len(validation)) == (TRAIN_SIZE, VALIDATION_SIZE) == (640, 128)
    assert all(list(row) == ["secret"] for row in train + validation)
    train_words = {row["secret"] for row in train}
    validation_words = {row["secret"] for row in validation}
    assert len(train_words) == 640 and len(validation_words) == 128
    assert not train_words & validation_words
    assert (train_words | validation_words) <= set(answers())


def test_split_is_reproducible_per_seed_and_differs_across_seeds() -> None:
    assert split_secrets(3) == split_secrets(3)
    assert split_secrets(3) != split_secrets(4)
    train, validation = split_secrets(4)
    assert not set(train) & set(validation)


def test_split_refuses_a_pool_too_small() -> None:
    with pytest.raises(ValueError, match="only 3 words"):
        split_secrets(0, train_size=2, validation_size=2, pool=["crane", "pilot", "abbey"])
