"""What of a dataset row goes to the agent: the service's ``prompt`` column, or the whole row.

SageMaker AI's Multi-Turn RL sends the agent only the row's ``prompt`` column, as a string; an agent
written for it parses that string. rftkit does the same when rows carry the column, so a dataset in the
service's format (``{"prompt": "{\\"question\\": ...}"}``) trains unchanged, and sends rows without
it whole, as its own agents expect. Also where a run's rows come from: the JSONL files, their order
per epoch, and the seeds derived from a run's position.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer.errors import TrainingError
from trainer.learner.checkpoint import DataPosition

SERVICE_PROMPT_COLUMN = "prompt"


class PromptColumnError(ValueError):
    """The configured prompt column is in none of the rows."""


def select_prompts(rows: Sequence[Any], column: str | None, *, source: str) -> list[Any]:
    """Each row's ``column`` value where the row is an object holding it, else the row itself.

    ``column=None`` sends every row whole. A column other than the service's ``prompt`` that no row
    holds is a typo, not a choice: it raises :class:`PromptColumnError`.
    """
    if column is None:
        return list(rows)
    holding = [isinstance(row, dict) and column in row for row in rows]
    if column != SERVICE_PROMPT_COLUMN and rows and not any(holding):
        raise PromptColumnError(
            f"prompt_column is {column!r} but no row of {source} has that field: name a field the rows "
            "hold, or set prompt_column to null to send whole rows"
        )
    return [row[column] if held else row for row, held in zip(rows, holding, strict=True)]


def derived_seed(*parts: object) -> int:
    """A 31-bit seed from the config seed and a position (step, group, member, ...): stable across runs."""
    digest = hashlib.sha256(":".join(str(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def dataset_row_name(path: Path | None, index: int) -> str:
    """How a failure names the row it played: the file and the row's number (blank lines not counted)."""
    return f"{path.name if path is not None else 'data'} row {index + 1}"


def read_rows(path: Path) -> list[Any]:
    """JSONL rows as they are (``select_prompts`` picks what of each goes to the agent)."""
    if not path.is_file():
        raise TrainingError(f"data file {path} does not exist")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise TrainingError(f"{path}:{number} is not JSON: {error}") from None
    if not rows:
        raise TrainingError(f"data file {path} holds no rows")
    return rows


def prompts(rows: list[Any], column: str | None, path: Path) -> list[Any]:
    """``select_prompts`` of a data file's rows; a column no row holds stops the run."""
    try:
        return select_prompts(rows, column, source=str(path))
    except PromptColumnError as error:
        raise TrainingError(str(error)) from None


def next_rows(
    rows: Sequence[Any], count: int, position: DataPosition, *, seed: int, shuffle: bool
) -> tuple[list[tuple[int, Any]], DataPosition]:
    """The next ``count`` rows (with their indices) and the position after them; epochs wrap."""
    picked: list[tuple[int, Any]] = []
    epoch, order, index = position.epoch, list(position.order), position.index
    while len(picked) < count:
        if not order or index >= len(order):
            if order:
                epoch += 1
            order = list(range(len(rows)))
            if shuffle:
                random.Random(derived_seed(seed, "epoch", epoch)).shuffle(order)
            index = 0
        picked.append((order[index], rows[order[index]]))
        index += 1
    return picked, DataPosition(epoch=epoch, order=order, index=index)
