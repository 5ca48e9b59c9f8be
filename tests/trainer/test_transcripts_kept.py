"""A step's best and worst episodes are kept besides the seeded sample (issue 50.6): 4 of 8
episodes were kept at random, so a step's one success could be missing from `rft show --best` and
`--export-demos`. Episodes are the real transcript lines of played rollouts (tiny model's tokenizer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from handlers import FailureCause
from handlers.cli import main as rft
from policy_server.models import load_tokenizer
from policy_server.trace import CallRecord, RolloutTrace
from trainer.config import TranscriptsConfig
from trainer.ops.transcripts import TranscriptKeeper, pick, transcript_path
from trainer.rollouts.fanout import RolloutRequest
from trainer.rollouts.outcomes import RolloutOutcome
from trainer.rollouts.producer import PlayedRollout

SEED, STEP, GROUP = 3, 1, 8


def played(tokenizer, index: int, reward: float | None) -> PlayedRollout:
    """Rollout ``index`` of one row's group: a question and the model's answer; failed without reward."""
    answer = "The answer is 4." if reward == 1.0 else f"Perhaps {index}."
    ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    call = CallRecord(
        index=0,
        prompt_token_ids=[1],
        completion_token_ids=ids,
        completion_logprobs=[0.0] * len(ids),
        adapter_version=1,
        finish_reason="stop",
        started_at=0.0,
        finished_at=0.0,
        messages=[{"role": "user", "content": "What is 2 + 2?"}],
    )
    rollout_id = f"step-{STEP}-{index}"
    request = RolloutRequest(
        row=json.dumps({"question": "2 + 2"}),
        rollout_id=rollout_id,
        group_index=0,
        job_arn="job",
        endpoint="",
    )
    outcome = (
        RolloutOutcome(rollout_id, 0, "failed", cause=FailureCause.AGENT_ERROR, error="crashed")
        if reward is None
        else RolloutOutcome(rollout_id, 0, "ok", rewards=[reward], reward=reward)
    )
    return PlayedRollout(request, outcome, RolloutTrace(job_arn="job", rollout_id=rollout_id, calls=[call]))


@pytest.fixture
def run_dir(tiny_model_dir: Path, tmp_path: Path) -> Path:
    sample = pick(4, GROUP, SEED, "transcripts", "step", STEP)
    win, crash = [index for index in range(GROUP) if index not in sample][:2]
    tokenizer = load_tokenizer(tiny_model_dir, None)
    rewards: list[float | None] = [0.0] * GROUP
    rewards[win], rewards[crash] = 1.0, None
    keeper = TranscriptKeeper(tmp_path, TranscriptsConfig(per_step=4), SEED, tiny_model_dir, None)
    keeper.keep_step(STEP, [played(tokenizer, index, reward) for index, reward in enumerate(rewards)])
    return tmp_path


def test_the_steps_one_success_is_kept_and_shown_first_by_best(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [json.loads(line) for line in transcript_path(run_dir, "step", STEP).read_text().splitlines()]
    assert [line["kept"] for line in lines].count(["sample"]) == 4
    (best,) = [line for line in lines if "best" in line["kept"]]
    (worst,) = [line for line in lines if "worst" in line["kept"]]
    assert best["reward"] == 1.0 and best["kept"] == ["best"]
    assert worst["status"] == "failed" and worst["kept"] == ["worst"]
    assert rft(["show", str(run_dir), "--best", "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert (
        "1 of the 6 episodes kept of step 1 (4 picked by the seed, and the step's best and worst by reward)"
        in out
    )
    assert "reward 1.0000 · ok · best of the step" in out and "The answer is 4." in out
    assert rft(["show", str(run_dir), "--worst", "-n", "1"]) == 0
    assert "FAILED (agent_error): crashed" in capsys.readouterr().out


def test_the_steps_one_success_is_exported_as_a_demonstration(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    demos = tmp_path / "demos.jsonl"
    assert rft(["show", str(run_dir), "--export-demos", str(demos), "--min-reward", "1"]) == 0
    assert "wrote 1 demonstrations" in capsys.readouterr().out
    (line,) = [json.loads(text) for text in demos.read_text().splitlines()]
    assert line["messages"][-1] == {"role": "assistant", "content": "The answer is 4."}


def test_a_step_whose_episodes_all_scored_alike_keeps_the_sample_only(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    tokenizer = load_tokenizer(tiny_model_dir, None)
    keeper = TranscriptKeeper(tmp_path, TranscriptsConfig(per_step=4), SEED, tiny_model_dir, None)
    keeper.keep_step(STEP, [played(tokenizer, index, 0.5) for index in range(GROUP)])
    lines = transcript_path(tmp_path, "step", STEP).read_text().splitlines()
    assert [json.loads(line)["kept"] for line in lines] == [["sample"]] * 4
