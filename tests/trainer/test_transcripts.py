"""Transcripts, `rft show` and what `rft status` says of the policy, on the run directory of a real
one-step `rft train` (tiny model, hf engine, a real agent app on uvicorn).

The agent asks the policy twice with a tool offered; between the calls it puts a tool call of its own
and the tool's result into the conversation, so the second call's messages hold both. Every rollout
of the row "count to five" crashes (a failed rollout with its error text).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from agents.letters.main import reward_of
from agents.letters.run_files import serving, write_run_files
from handlers import RolloutContext, rft_app
from handlers.cli import main as rft
from policy_server import CallRecord
from policy_server.models import load_tokenizer
from trainer.config import load_config
from trainer.loop import train
from trainer.ops.transcripts import call_view, pick, transcript_path

ROWS = ["name a fruit", "count to five"]
CRASH = "the environment crashed on 'count to five'"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
]
TOOL_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "lookup", "arguments": '{"word": "fruit"}'},
}


async def _rollout(row: dict[str, Any], ctx: RolloutContext) -> dict[str, Any]:
    if row["question"] == "count to five":
        raise RuntimeError(CRASH)
    params = ctx.openai_params()  # the rollout's seed included
    messages: list[dict[str, Any]] = [{"role": "user", "content": row["question"]}]
    replies = []
    async with ctx.async_openai_client() as client:
        for turn in range(2):
            answer = await client.chat.completions.create(
                model=ctx.model_id, messages=messages, tools=TOOLS, **params
            )
            replies.append(answer.choices[0].message.content or "")
            if turn == 0:
                messages += [
                    {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "apple, a fruit"},
                ]
    return {
        "reward": reward_of(replies),
        "metrics": {"reply_chars": float(sum(map(len, replies))), "tools": 1.0},
    }


def _train(directory: Path, model_dir: Path, per_step: int) -> Path:
    with serving(rft_app(_rollout)) as agent_url:
        fields = {"max_steps": 1, "max_retries": 0, "transcripts": {"per_step": per_step, "per_eval": 4}}
        path = write_run_files(directory, model_dir, agent_url, **fields)
        (directory / "train.jsonl").write_text("".join(json.dumps({"question": q}) + "\n" for q in ROWS))
        config = load_config(path)
        train(config)
    return Path(config.output_dir)


def _episodes(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train(tmp_path_factory.mktemp("transcripts"), tiny_model_dir, per_step=8)


def test_a_run_keeps_each_steps_and_evaluations_episodes(run_dir: Path) -> None:
    episodes = _episodes(transcript_path(run_dir, "step", 1))
    assert len(episodes) == 8  # per_step 8: all of the step's rollouts (2 rows x 4 generations)
    ok = [episode for episode in episodes if episode["status"] == "ok"]
    assert len(ok) == 4
    for episode in ok:
        assert episode["row_index"] == 0 and episode["row_name"] == "train.jsonl row 1"
        replies = [call["content"] or "" for call in episode["calls"]]
        assert episode["reward"] == reward_of(replies)
        assert episode["metrics"] == {"reply_chars": float(sum(map(len, replies))), "tools": 1.0}
        assert episode["failure"] is None
        first, second = episode["calls"]
        assert second["prompt_tokens"] > first["prompt_tokens"] and first["tool_calls"] == []
        roles = [message["role"] for message in episode["messages"]]
        assert roles == ["user", "assistant", "tool", "assistant"]
        assert episode["messages"][1]["tool_calls"][0]["function"]["name"] == "lookup"
        assert episode["messages"][-1]["content"] == second["content"]
    # The same rows and seeds at every evaluation: before and after read side by side.
    before, after = (_episodes(transcript_path(run_dir, "eval", step)) for step in (0, 1))
    assert [(e["row_index"], e["seed"]) for e in before] == [(e["row_index"], e["seed"]) for e in after]
    assert [e["row_name"] for e in before] == ["eval.jsonl row 1", "eval.jsonl row 2"]


def test_a_failed_rollouts_transcript_keeps_its_failure_text(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failed = [e for e in _episodes(transcript_path(run_dir, "step", 1)) if e["status"] == "failed"]
    assert len(failed) == 4 and {e["row_index"] for e in failed} == {1}
    assert failed[0]["failure"]["cause"] == "agent_error" and CRASH in failed[0]["failure"]["error"]
    assert failed[0]["reward"] is None
    assert rft(["show", str(run_dir), "--worst", "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert "train.jsonl row 2" in out and "FAILED (agent_error):" in out and CRASH in out


def test_rft_show_prints_messages_tool_calls_and_the_reward(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    best = max(
        (e for e in _episodes(transcript_path(run_dir, "step", 1)) if e["reward"] is not None),
        key=lambda e: e["reward"],
    )
    assert rft(["show", str(run_dir), "--step", "1", "--best", "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 of the 8 episodes kept of step 1" in out
    assert f"reward {best['reward']:.4f}" in out
    assert "[user]\n    name a fruit" in out
    assert '-> tool call lookup({"word": "fruit"})' in out
    assert "[tool result for call_1]\n    apple, a fruit" in out
    assert f"metrics: reply_chars {best['metrics']['reply_chars']:g}, tools 1" in out


def test_worst_and_best_order_by_reward(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def shown(order: str) -> list[str]:
        assert rft(["show", str(run_dir), order]) == 0
        return re.findall(r"(reward \d\.\d{4}|no reward)", capsys.readouterr().out)

    worst, best = shown("--worst"), shown("--best")
    assert worst[:4] == ["no reward"] * 4 and best[-4:] == ["no reward"] * 4
    rewards = [float(label.split()[1]) for label in worst[4:]]
    assert rewards == sorted(rewards) and len(rewards) == 4
    assert [float(label.split()[1]) for label in best[:4]] == sorted(rewards, reverse=True)


def test_rft_show_names_what_a_run_kept(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert rft(["show", str(run_dir), "--eval", "0"]) == 0
    assert "2 of the 2 episodes kept of eval 0" in capsys.readouterr().out
    assert rft(["show", str(run_dir), "--step", "7"]) == 2
    out = capsys.readouterr().out
    assert "no transcripts of step 7" in out and "kept: steps 1" in out


def test_the_same_seed_keeps_the_same_episodes(run_dir: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    everything = _episodes(transcript_path(run_dir, "step", 1))
    kept = _episodes(transcript_path(_train(tmp_path, tiny_model_dir, per_step=3), "step", 1))
    positions = pick(3, 8, 3, "transcripts", "step", 1)  # seed 3: write_run_files' config
    # Besides the seeded three, the step's best and worst by reward (50.6), wherever they are.
    again = [episode for episode in kept if "sample" in episode["kept"]]
    assert len(again) == 3
    for kept, position in zip(again, positions, strict=True):
        same = everything[position]
        for field in ("row_index", "seed", "reward", "status", "messages"):
            assert kept[field] == same[field], field
        assert [call["completion"] for call in kept["calls"]] == [
            call["completion"] for call in same["calls"]
        ]


def test_rft_status_prints_the_agent_metrics_and_fidelity(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert rft(["status", str(run_dir)]) == 0
    out = capsys.readouterr().out
    (record,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    metrics, fidelity = record["agent_metrics"], record["fidelity"]
    assert f"agent metrics, step 1: reply_chars {metrics['reply_chars']:.4g}, tools 1" in out
    evaluation = record["eval"]["agent_metrics"]
    assert f"agent metrics, evaluation at step 1: reply_chars {evaluation['reply_chars']:.4g}, tools 1" in out
    assert f"|Δlogp| mean {fidelity['logprob_abs_diff_mean']:.4g}" in out
    assert f"prefix breaks {fidelity['prefix_breaks']}" in out
    assert f"unparsed tool calls {fidelity['unparsed_tool_calls']} of {fidelity['calls']} calls" in out
    assert fidelity["calls"] == 8
    assert "unparsed tool calls over the run: " in out


def test_a_completion_is_parsed_as_the_server_parses_it(tiny_model_dir: Path) -> None:
    tokenizer = load_tokenizer(tiny_model_dir)

    def decode(ids: list[int], keep_special: bool) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=not keep_special))

    text = 'I look. <tool_call>{"name": "lookup", "arguments": {"word": "sky"}}</tool_call>'
    ids = tokenizer.encode(text) + [tokenizer.eos_token_id]

    def record(finish_reason: str, unparsed: bool = False) -> CallRecord:
        return CallRecord(
            index=0,
            prompt_token_ids=[1, 2],
            completion_token_ids=ids,
            completion_logprobs=[0.0] * len(ids),
            adapter_version=0,
            finish_reason=finish_reason,
            started_at=0.0,
            finished_at=0.0,
            unparsed_tool_call=unparsed,
        )

    parsed = call_view(record("tool_calls"), decode)
    assert parsed["completion"] == text and parsed["content"] == "I look."
    assert parsed["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"word": "sky"}'}
    # A call that offered no tools (or named tool_choice none) answered the text as it is.
    plain = call_view(record("stop", unparsed=True), decode)
    assert plain["tool_calls"] == [] and plain["content"] == text and plain["unparsed_tool_call"]
