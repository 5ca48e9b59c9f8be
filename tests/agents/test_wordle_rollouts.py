"""Full rollouts of the real Wordle app through the real Strands loop against the suite's scripted model
server (``tests/scripted_model.py``) on 127.0.0.1: scripted turns per rollout (chosen by the rollout's
trajectory-id header), requests and feedback posts recorded.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agents.wordle.main import app as wordle_app
from handlers import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER
from handlers.serving import serve_in_thread
from tests.scripted_model import ScriptedModel, Turn, text, tool, tools

JOB_ARN = "arn:aws:sagemaker:us-west-2:123456789012:training-job/wordle-test"


def turns(*script: list[str] | str) -> list[Turn]:
    """A list of guesses is one assistant message with a guess_word call each; a string is plain text."""
    return [
        text(turn) if isinstance(turn, str) else tools(*(tool("guess_word", guess=g) for g in turn))
        for turn in script
    ]


@pytest.fixture
def model() -> Iterator[tuple[ScriptedModel, str]]:
    scripted = ScriptedModel(default_turn=text("I give up."))
    with serve_in_thread(scripted.app()) as url:
        yield scripted, url


@pytest.fixture(scope="module")
def agent_url() -> Iterator[str]:
    with serve_in_thread(wordle_app) as url:
        yield url


def payload(rollout_id: str, endpoint: str, prompt: Any) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "metadata": {"jobArn": JOB_ARN, "rolloutId": rollout_id, "endpoint": endpoint},
        "inferenceParams": {"temperature": 0.7, "maxTokens": 256},
    }


def invoke(agent_url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{agent_url}/invocations", json=body, timeout=60)


def test_a_won_game_over_real_sockets(model: tuple[ScriptedModel, str], agent_url: str) -> None:
    scripted, endpoint = model
    # Turn 1: an invalid word (refused, no guess spent) then a real guess, in one batch; turn 2 wins.
    scripted.scripts["win-1"] = turns(["zzzzz", "pilot"], ["crane"], "never requested")
    response = invoke(agent_url, payload("win-1", endpoint, {"secret": "crane"}))
    assert response.status_code == 200, response.text
    result = response.json()
    expected = 1.05 + 0.09 * (6 - 2) + 0.05 / 2
    assert result["reward"] == pytest.approx(expected)
    assert result["metrics"] == {"solved": 1.0, "guesses": 2.0, "invalid_attempts": 1.0, "tool_calls": 3.0}
    reports = scripted.feedback("win-1")
    assert reports["/update-reward"]["Rewards"] == [pytest.approx(expected)]
    assert reports["/update-reward"]["JobArn"] == JOB_ARN
    assert reports["/complete-rollout"]["Status"] == "ready"

    # The winning guess ends the episode: no third model call; the scripted turn stays unused.
    assert len(scripted.calls) == 2
    assert scripted.scripts["win-1"] == turns("never requested")
    for headers, body in ((call.headers, call.body) for call in scripted.calls):
        assert headers[JOB_ARN_HEADER.lower()] == JOB_ARN
        assert headers[TRAJECTORY_ID_HEADER.lower()] == "win-1"
        assert body["stream"] is True and body["temperature"] == 0.7 and body["max_tokens"] == 256
        assert [tool["function"]["name"] for tool in body["tools"]] == ["guess_word"]
        assert "crane" not in json.dumps(body["messages"]).lower()
    # The second call carries the feedback of both tool calls, in the order they were made.
    tool_results = [m for m in scripted.calls[1].body["messages"] if m["role"] == "tool"]
    texts = [json.dumps(m["content"]) for m in tool_results]
    assert "Invalid guess" in texts[0] and "you have 6 left" in texts[0]
    assert "Guess 1 of 6: PILOT" in texts[1] and "Guesses left: 5." in texts[1]


def test_concurrent_rollouts_keep_their_own_games(model: tuple[ScriptedModel, str], agent_url: str) -> None:
    scripted, endpoint = model
    misses = ["pilot", "ghost", "dumpy", "whisk", "fjord"]
    for n in range(1, 7):
        scripted.scripts[f"conc-{n}"] = turns(*([word] for word in misses[: n - 1]), ["crane"])

    async def run_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=agent_url, timeout=60) as client:
            bodies = [payload(f"conc-{n}", endpoint, {"secret": "crane"}) for n in range(1, 7)]
            return await asyncio.gather(*(client.post("/invocations", json=body) for body in bodies))

    responses = asyncio.run(run_all())
    for n, response in enumerate(responses, start=1):
        assert response.status_code == 200, response.text
        expected = 1.05 + 0.09 * (6 - n) + 0.05
        assert response.json()["reward"] == pytest.approx(expected)
        assert response.json()["metrics"]["guesses"] == n
        assert scripted.feedback(f"conc-{n}")["/update-reward"]["Rewards"] == [pytest.approx(expected)]
    assert len(scripted.calls) == sum(range(1, 7))


def test_a_lost_game_in_process(model: tuple[ScriptedModel, str]) -> None:
    scripted, endpoint = model
    scripted.scripts["loss-1"] = turns(["pilot"], ["cream", "brave"], ["crate"], ["grace"], ["trace"], "more")
    transport = httpx.ASGITransport(app=wordle_app)

    async def run() -> httpx.Response:
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
            # The row may also arrive as a JSON string.
            body = payload("loss-1", endpoint, json.dumps({"secret": "crane"}))
            return await client.post("/invocations", json=body, timeout=60)

    response = asyncio.run(run())
    assert response.status_code == 200, response.text
    result = response.json()
    # Six valid guesses, all wrong; known: C, R, A, E green (positions 1-3, 5), nothing unplaced.
    expected = -0.5 + 0.2 * 4 / 5 + 0.05
    assert result["reward"] == pytest.approx(expected)
    assert result["metrics"]["solved"] == 0.0 and result["metrics"]["guesses"] == 6.0
    reports = scripted.feedback("loss-1")
    assert reports["/update-reward"]["Rewards"] == [pytest.approx(expected)]
    assert reports["/complete-rollout"]["Status"] == "ready"
    assert len(scripted.calls) == 5
    assert scripted.scripts["loss-1"] == turns("more")


def test_no_play_when_the_model_endpoint_answers_400_could_not_find_job(
    model: tuple[ScriptedModel, str], agent_url: str
) -> None:
    scripted, endpoint = model
    scripted.refuse_status = 400
    response = invoke(agent_url, payload("smoke-1", endpoint, {"secret": "crane"}))
    assert response.status_code == 200, response.text
    assert response.json()["reward"] == -1.5
    reports = scripted.feedback("smoke-1")
    assert reports["/update-reward"]["Rewards"] == [-1.5]
    assert reports["/complete-rollout"]["Status"] == "ready"
    assert len(scripted.calls) == 1


def test_an_infrastructure_error_fails_the_rollout_instead_of_scoring_it(
    model: tuple[ScriptedModel, str], agent_url: str
) -> None:
    scripted, endpoint = model
    scripted.refuse_status = 403
    response = invoke(agent_url, payload("denied-1", endpoint, {"secret": "crane"}))
    assert response.status_code == 500
    assert "PermissionDeniedError" in response.json()["error"]
    reports = scripted.feedback("denied-1")
    assert reports["/complete-rollout"]["Status"] == "failed"
    assert "/update-reward" not in reports


def test_a_model_that_stops_talking_loses_with_what_it_found(
    model: tuple[ScriptedModel, str], agent_url: str
) -> None:
    scripted, endpoint = model
    scripted.scripts["quit-1"] = turns(["pilot"], "I cannot think of another word.")
    response = invoke(agent_url, payload("quit-1", endpoint, {"secret": "crane"}))
    assert response.status_code == 200, response.text
    assert response.json()["reward"] == pytest.approx(-0.5 + 0.05)
    assert len(scripted.calls) == 2


def test_a_looping_model_is_stopped_by_the_tool_call_cap(
    model: tuple[ScriptedModel, str], agent_url: str
) -> None:
    scripted, endpoint = model
    scripted.scripts["loop-1"] = turns(["zzzzz", "qqqqq"]) * 15
    response = invoke(agent_url, payload("loop-1", endpoint, {"secret": "crane"}))
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["metrics"]["tool_calls"] == 20.0 and result["metrics"]["guesses"] == 0.0
    assert result["reward"] == pytest.approx(-1.5 - 0.05 * (1 - 1 / 21))
    assert len(scripted.calls) == 10


def test_an_unknown_secret_is_refused_with_a_clear_error(
    model: tuple[ScriptedModel, str], agent_url: str
) -> None:
    scripted, endpoint = model
    response = invoke(agent_url, payload("bad-1", endpoint, {"secret": "qzxjv"}))
    assert response.status_code == 400
    assert "'qzxjv' is not a 5-letter word in the Wordle word list" in response.json()["error"]
    assert scripted.feedback("bad-1")["/complete-rollout"]["Status"] == "failed"
    assert scripted.calls == []
    response = invoke(agent_url, payload("bad-2", endpoint, {"word": "crane"}))
    assert response.status_code == 400
    assert 'like {"secret": "crane"}' in response.json()["error"]
