"""`rft smoke URL --model DIR` plays real episodes of the payload's row against a real local policy (the
tiny model on the hf engine behind the policy gateway) and prints each transcript, the reward and the
agent's metrics; a reward that is not a number is reported with a sentence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from handlers import RolloutContext, refused_by_endpoint, rft_app
from handlers.smoke_cli import main as smoke

TEMPLATE_PAYLOAD = Path(__file__).resolve().parents[2] / "agents" / "template" / "payloads" / "smoke.json"


def _short_payload(tmp_path: Path) -> Path:
    """The template's payload with few tokens a call, so the tiny model's episodes stay short."""
    payload = json.loads(TEMPLATE_PAYLOAD.read_text())
    payload["inferenceParams"]["maxTokens"] = 24
    path = tmp_path / "smoke.json"
    path.write_text(json.dumps(payload))
    return path


def _string_reward_app() -> Any:
    """An agent whose played episodes return the reward as a string, the bug smoke must show."""

    def rollout(row: Any, ctx: RolloutContext) -> Any:
        tool = {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look up a word.",
                "parameters": {"type": "object"},
            },
        }
        try:
            ctx.openai_client().chat.completions.create(
                model=ctx.model_id,
                messages=[{"role": "user", "content": "Look up the word 'kit'."}],
                tools=[tool],
                max_tokens=8,
            )
        except Exception as error:
            if refused_by_endpoint(error):
                return -1.0
            raise
        return {"reward": "1.0", "metrics": {"turns": 1}}

    return rft_app(rollout)


def test_the_template_plays_a_real_episode_and_its_transcript_is_printed(
    serve: Any, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agents.template.main import SYSTEM_PROMPT, app

    url = serve(app)
    code = smoke(
        [url, "--payload", str(_short_payload(tmp_path)), "--model", str(tiny_model_dir), "--episodes", "2"]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "HEALTHY" in printed  # the refusal check ran first
    assert "=== episode 1 · the payload's row" in printed and "=== episode 2" in printed
    assert "[system]" in printed and SYSTEM_PROMPT in printed
    assert "What is 12 * (3 + 4)?" in printed  # the row's question, as the model saw it
    assert "model calls: 1;" in printed or "model calls: 2;" in printed
    assert "reward 0.0000" in printed or "reward 1.0000" in printed
    assert "2 of 2 episode(s) came back with a reward" in printed


def test_a_string_reward_is_reported_with_a_sentence(
    serve: Any, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = serve(_string_reward_app())
    code = smoke([url, "--payload", str(_short_payload(tmp_path)), "--model", str(tiny_model_dir)])
    printed = capsys.readouterr().out
    assert code == 3, printed
    assert "HEALTHY" in printed  # the refusal path returns a float: only real play shows the bug
    assert "[user]" in printed and "Look up the word 'kit'." in printed
    assert "the agent's reward is not a number" in printed
    assert "'1.0'" in printed and "return a float from the rollout function" in printed
    assert "0 of 1 episode(s) came back with a reward" in printed


def test_model_needs_an_agent_url_and_a_model_directory(
    serve: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agents.template.main import app

    arn = "arn:aws:bedrock-agentcore:us-east-1:111122223333:runtime/agent-abc"
    assert smoke([arn, "--model", str(tmp_path)]) == 2
    assert "--model plays 1 or more --episodes against an agent URL" in capsys.readouterr().out
    url = serve(app)
    assert smoke([url, "--payload", str(TEMPLATE_PAYLOAD), "--model", str(tmp_path)]) == 2
    assert f"rft smoke: {tmp_path} is not a model directory (no config.json in it)" in capsys.readouterr().out
