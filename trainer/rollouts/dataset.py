"""What of a dataset row goes to the agent: the service's ``prompt`` column, or the whole row.

SageMaker AI's Multi-Turn RL sends the agent only the row's ``prompt`` column, as a string; an agent
written for it parses that string. rftkit does the same when rows carry the column, so a dataset in the
service's format (``{"prompt": "{\\"question\\": ...}"}``) trains unchanged, and sends rows without
it whole, as its own agents expect.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
