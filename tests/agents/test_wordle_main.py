"""The Wordle agent's row parsing and its rule for which model errors end a game as it stands."""

from __future__ import annotations

import httpx
import openai
import pytest
from strands.types.exceptions import ContextWindowOverflowException, MaxTokensReachedException

from agents.wordle.main import UnknownSecretError, ends_episode, parse_secret


def api_error(cls: type[openai.APIStatusError], status: int) -> openai.APIStatusError:
    response = httpx.Response(status, request=httpx.Request("POST", "http://127.0.0.1/v1/chat/completions"))
    return cls("refused", response=response, body=None)


@pytest.mark.parametrize("row", [{"secret": "crane"}, '{"secret": "crane"}', {"secret": " CRANE "}])
def test_parse_secret_accepts_an_object_or_its_json_string(row: object) -> None:
    assert parse_secret(row) == "crane"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"secret": "qzxjv"}, "not a 5-letter word in the Wordle word list"),
        ({"secret": "cranes"}, "not a 5-letter word in the Wordle word list"),
        ({"word": "crane"}, 'like {"secret": "crane"}'),
        ("crane", "must be a JSON object"),
        ([1, 2], 'like {"secret": "crane"}'),
    ],
)
def test_parse_secret_refuses_rows_it_cannot_play(row: object, message: str) -> None:
    with pytest.raises(UnknownSecretError, match=message):
        parse_secret(row)


def test_errors_that_end_the_game_as_it_stands() -> None:
    bad_request = api_error(openai.BadRequestError, 400)
    assert ends_episode(bad_request)
    assert ends_episode(ContextWindowOverflowException("too long"))
    assert ends_episode(MaxTokensReachedException("truncated"))
    try:
        raise RuntimeError("wrapped") from bad_request
    except RuntimeError as wrapped:
        assert ends_episode(wrapped)


def test_infrastructure_errors_fail_the_rollout() -> None:
    assert not ends_episode(api_error(openai.PermissionDeniedError, 403))
    assert not ends_episode(api_error(openai.InternalServerError, 500))
    assert not ends_episode(openai.APIConnectionError(request=httpx.Request("POST", "http://127.0.0.1")))
    assert not ends_episode(RuntimeError("boom"))
