"""`rft show RUN --export-demos FILE --min-reward X`: demonstrations collected from the transcripts of a
real one-step `rft train` (tiny model, hf engine, a real tool-offering agent on uvicorn) load with
`rft sft`'s loader and train with `rft sft --data`; only episodes at or above the reward are kept."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from agents.letters.main import reward_of
from agents.letters.run_files import serving, write_run_files
from handlers import RolloutContext, rft_app
from handlers.cli import main as rft
from trainer.config import load_config
from trainer.loop import train
from trainer.sft import load_demonstrations

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


async def _rollout(row: dict[str, Any], ctx: RolloutContext) -> float:
    """Two calls with a tool offered, the agent's own tool call and its result between them."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": row["question"]}]
    replies = []
    async with ctx.async_openai_client() as client:
        for turn in range(2):
            answer = await client.chat.completions.create(
                model=ctx.model_id, messages=messages, tools=TOOLS, **ctx.openai_params()
            )
            replies.append(answer.choices[0].message.content or "")
            if turn == 0:
                call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
                messages += [
                    {"role": "assistant", "content": replies[0], "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "a word"},
                ]
    return reward_of(replies)


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("demos")
    with serving(rft_app(_rollout)) as agent_url:
        fields = {"max_steps": 1, "max_retries": 0, "transcripts": {"per_step": 8, "per_eval": 4}}
        config = load_config(write_run_files(directory, tiny_model_dir, agent_url, **fields))
        train(config)
    return Path(config.output_dir)


def _kept_episodes(run_dir: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted((run_dir / "transcripts").glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def test_only_episodes_at_or_above_the_reward_become_loadable_demonstrations(
    run_dir: Path, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    episodes = _kept_episodes(run_dir)
    rewards = sorted({episode["reward"] for episode in episodes})
    assert len(rewards) > 2, "the tiny model's episodes should score differently"
    threshold = statistics.median(rewards)
    above = [episode for episode in episodes if episode["reward"] >= threshold]
    assert 0 < len(above) < len(episodes)

    out = tmp_path / "demos.jsonl"
    assert rft(["show", str(run_dir), "--export-demos", str(out), "--min-reward", str(threshold)]) == 0
    printed = capsys.readouterr().out
    demos = load_demonstrations(out)
    assert f"wrote {len(demos)} demonstrations to {out} from {len(episodes)} kept episodes" in printed
    expected = {json.dumps(episode["messages"]) for episode in above}
    assert len(demos) == len(expected)  # evaluations repeat their episodes: each written once
    for demo in demos:
        assert json.dumps(demo["messages"]) in expected
        assert demo["tools"] == TOOLS
        assert [message["role"] for message in demo["messages"]] == ["user", "assistant", "tool", "assistant"]

    # The file is what `rft sft --data` trains on.
    sft_out = tmp_path / "adapter"
    args = ["sft", "--model", str(tiny_model_dir), "--data", str(out), "--out", str(sft_out), "--steps", "1"]
    assert rft([*args, "--lora-r", "4"]) == 0
    assert (sft_out / "adapter_config.json").is_file()


def test_exporting_says_what_to_change_when_nothing_qualifies(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "none.jsonl"
    assert rft(["show", str(run_dir), "--export-demos", str(out), "--min-reward", "2"]) == 2
    assert (
        "has a reward of at least 2 and a whole conversation: lower --min-reward" in capsys.readouterr().out
    )
    assert not out.exists()
    assert rft(["show", str(run_dir), "--export-demos", str(out)]) == 2
    assert "--export-demos needs --min-reward X" in capsys.readouterr().out
