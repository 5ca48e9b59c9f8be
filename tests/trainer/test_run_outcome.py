"""How a run ends when no step updated its adapter (issue 50, items 3 and 5): failed rollouts named
with their cause, text and row, exit 1, no warm-start advice; a warm start the run never changed said
to be the final adapter unchanged; and the run's memory plan counting the warm start's LoRA."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents.letters.run_files import serving, write_run_files
from handlers import RolloutContext, rft_app
from trainer import cli


def _needs_a_question() -> Any:
    async def rollout(row: Any, ctx: RolloutContext) -> float:
        question = row["question"]  # a row without the field fails here, as the agent did
        async with ctx.async_openai_client() as client:
            await client.chat.completions.create(
                model=ctx.model_id, messages=[{"role": "user", "content": question}]
            )
        return 1.0

    return rft_app(rollout)


def test_a_run_whose_rollouts_failed_and_never_updated_names_the_failures_and_exits_1(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's run: a row lacks the field the agent reads, its rollouts fail with KeyError, the
    other row's rewards are all equal, so no step updates."""
    with serving(_needs_a_question()) as agent_url:
        path = write_run_files(tmp_path, tiny_model_dir, agent_url, max_steps=1, eval_file=None)
        rows = [{"question": "name a fruit"}, {"text": "count to five"}]
        (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        assert cli.main([str(path)]) == 1
    err = capsys.readouterr().err
    failure = "agent_error: HTTP 500: KeyError: 'question' (train.jsonl row 2)"
    assert f"failed=4/8 {failure}" in err  # the step's progress line
    assert err.strip().splitlines()[-1] == (
        f"rft train: 1 step done in {tmp_path / 'run'}; no step updated the adapter, and rollouts failed: "
        "agent_error x4 of 8 rollouts, first: HTTP 500: KeyError: 'question' (train.jsonl row 2). Fix what "
        "failed (the agents' own logs have the details) and train again"
    )


def _constant() -> Any:
    async def rollout(row: Any, ctx: RolloutContext) -> float:
        async with ctx.async_openai_client() as client:
            await client.chat.completions.create(
                model=ctx.model_id, messages=[{"role": "user", "content": row["question"]}]
            )
        return 1.0

    return rft_app(rollout)


def test_a_warm_start_no_step_updated_is_said_unchanged_and_the_plan_counts_its_lora(
    tiny_model_dir: Path, tmp_path: Path, random_adapter: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    warm = random_adapter(tmp_path / "warm", seed=1, rank=8)  # q, v, o and down projections
    with serving(_constant()) as agent_url:
        path = write_run_files(
            tmp_path, tiny_model_dir, agent_url, max_steps=1, eval_file=None, init_adapter=str(warm)
        )
        assert cli.main([str(path)]) == 0
    run = tmp_path / "run"
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        f"rft train: 1 step done in {run}; no step updated the adapter (every group lacked reward variance "
        f"or valid rollouts): the final adapter v1 at {run / 'adapters' / 'v1'} is the init_adapter unchanged"
    )
    # The config says lora.r 4 on every linear layer; the run trains the warm start, and plans it.
    plan = (run / "train.log").read_text()
    assert "LoRA r=8 + grads + AdamW" in plan and "LoRA r=4" not in plan
    assert "(4 adapted modules/layer, float32)" in plan
