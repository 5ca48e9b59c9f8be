"""`rft smoke URL --model DIR` plays real episodes of the payload's row against a real local policy (the
tiny model on the hf engine behind the policy gateway) and prints each transcript, the reward and the
agent's metrics; a reward that is not a number is reported with a sentence."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from handlers import RolloutContext, RolloutPayload, refused_by_endpoint, rft_app
from handlers.smoke_cli import main as smoke
from tests.policy_server.test_sigv4_token import KEY_ID, sign

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


def _crashes_once_played_app() -> Any:
    """An agent whose tool crashes whenever the model answers: the refusal path alone never shows it."""

    def rollout(row: Any, ctx: RolloutContext) -> float:
        try:
            ctx.openai_client().chat.completions.create(
                model=ctx.model_id, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        except Exception as error:
            if refused_by_endpoint(error):
                return -1.0
            raise
        raise RuntimeError("the tool crashed on the model's answer")

    return rft_app(rollout)


def test_smoke_without_model_says_no_episode_was_played(
    serve: Any, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = serve(_crashes_once_played_app())
    payload = str(_short_payload(tmp_path))
    assert smoke([url, "--payload", payload]) == 0
    printed = capsys.readouterr().out
    assert "HEALTHY" in printed
    assert (
        "not verified: the agent's play: no episode was played (every model call was answered 400)" in printed
    )
    assert "--model DIR plays real episodes" in printed
    assert smoke([url, "--payload", payload, "--model", str(tiny_model_dir)]) == 3
    printed = capsys.readouterr().out
    assert "the tool crashed on the model's answer" in printed and "no episode was played" not in printed
    assert "0 of 1 episode(s) came back with a reward" in printed


def _sagemaker_sdk_app(token: str) -> Any:
    """An agent that signs its model calls as AWS's SageMaker SDK does (a bearer token in place of the
    key), scores a refused call as its no-play reward -1.5 and a served one 0.5."""

    def rollout(row: Any, ctx: RolloutContext) -> float:
        headers = {name: value for name, value in ctx.headers.items() if name != "Authorization"}
        headers["Authorization"] = f"Bearer {token}"
        body = {"model": ctx.model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        answer = httpx.post(f"{ctx.endpoint}/v1/chat/completions", json=body, headers=headers, timeout=30)
        return -1.5 if answer.status_code >= 400 else 0.5

    return rft_app(rollout)


def test_model_play_takes_sagemaker_tokens_as_the_run_would(
    serve: Any, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = serve(_sagemaker_sdk_app(sign(at=datetime.now(UTC).replace(microsecond=0))))
    args = [url, "--payload", str(_short_payload(tmp_path)), "--accept-sagemaker-tokens"]
    code = smoke([*args, "--sagemaker-access-key-id", KEY_ID, "--model", str(tiny_model_dir)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "model calls: 1;" in printed and "reward 0.5000" in printed
    assert "1 of 1 episode(s) came back with a reward" in printed
    # An allow-list without the token's key id refuses it, as policy_server.sagemaker_access_key_ids does.
    assert smoke([*args, "--sagemaker-access-key-id", "AKIAOTHERKEYID000000"]) == 4
    printed = capsys.readouterr().out
    assert "HEALTHY" not in printed
    assert "a run refuses the agent's SageMaker token (401): " in printed
    assert f"access key id {KEY_ID} is not in the allow-list" in printed
    assert smoke([url, "--sagemaker-access-key-id", KEY_ID]) == 2
    assert "add --accept-sagemaker-tokens" in capsys.readouterr().out


def test_an_episode_whose_model_calls_were_all_refused_failed(
    serve: Any, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainer.smoke_play import play

    # Played with no SageMaker token policy: the gateway refuses the call, the agent answers -1.5.
    url = serve(_sagemaker_sdk_app(sign(at=datetime.now(UTC).replace(microsecond=0))))
    payload = RolloutPayload.model_validate(json.loads(_short_payload(tmp_path).read_text()))
    assert play(url, payload, tiny_model_dir, api_key="the-run-key") == 4
    printed = capsys.readouterr().out
    assert "· failed" in printed and "played" not in printed.split("0 of 1")[0].split("===")[-1]
    assert "model_calls_refused" in printed and "the gateway refused all 1 of its model calls" in printed
    assert "0 of 1 episode(s) came back with a reward" in printed
