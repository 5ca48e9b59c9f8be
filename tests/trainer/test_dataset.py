"""What of a dataset row goes to the agent: the service's `prompt` column, another one, or the whole row."""

from __future__ import annotations

import json

import pytest

from trainer.rollouts.dataset import PromptColumnError, select_prompts

SERVICE_ROW = {"prompt": json.dumps({"question": "What is 2 + 2?", "answer": 4}), "split": "train"}
OWN_ROW = {"secret": "crane"}


def test_rows_with_a_prompt_field_send_it_as_the_service_does_and_others_go_whole() -> None:
    assert select_prompts([SERVICE_ROW, OWN_ROW, "plain text"], "prompt", source="t.jsonl") == [
        SERVICE_ROW["prompt"],
        OWN_ROW,
        "plain text",
    ]


def test_null_sends_every_row_whole() -> None:
    assert select_prompts([SERVICE_ROW, OWN_ROW], None, source="t.jsonl") == [SERVICE_ROW, OWN_ROW]


def test_another_column_is_picked_and_a_column_no_row_holds_is_refused() -> None:
    assert select_prompts([{"task": {"n": 1}}, OWN_ROW], "task", source="t.jsonl") == [{"n": 1}, OWN_ROW]
    with pytest.raises(PromptColumnError, match="prompt_column is 'qustion' but no row of t.jsonl"):
        select_prompts([OWN_ROW], "qustion", source="t.jsonl")
