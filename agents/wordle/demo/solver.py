"""Games a solver plays, as demonstrations for the supervised warm start (``rft sft`` format).

The solver knows the secret pool (as any Wordle solver knows the answer list) but never the secret:
each guess is a word of the pool consistent with every answer so far (it would score the same
feedback had it been the secret), drawn at random; with chance ``noise`` it guesses any word of the
pool instead, a deliberately imperfect teacher, as the maze's noisy walker is. Each game is played
on the real :class:`~agents.wordle.game.WordleGame` and becomes one demonstration: the chat request
the agent would send for its last call (system prompt, the tool, the whole transcript, formatted by
Strands' own OpenAI model) followed by that call, so every guess of the game is trained at once.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import cache
from typing import Any

from strands.models.openai import OpenAIModel
from strands.types.content import Message, Messages

from agents.wordle.game import ScoredGuess, WordleGame, score_guess
from agents.wordle.main import OPENING_MESSAGE, SYSTEM_PROMPT, guess_word_tool
from agents.wordle.word_lists import allowed_guesses


@cache
def _formatter() -> OpenAIModel:
    """Strands' OpenAI request formatting; its client is never used (``format_request`` only shapes)."""
    return OpenAIModel(client_args={"api_key": "unused"}, model_id="demonstration")


def consistent(words: Sequence[str], guesses: Sequence[ScoredGuess]) -> list[str]:
    """The words that would have drawn exactly the feedback each guess got, had they been the secret."""
    return [word for word in words if all(score_guess(word, g.word) == g.marks for g in guesses)]


def solver_game(secret: str, pool: Sequence[str], rng: random.Random, noise: float = 0.0) -> list[str]:
    """The solver's guesses on ``secret``, the game played until won or lost."""
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"noise must be between 0 and 1, got {noise}")
    game = WordleGame(secret, allowed_guesses())
    while not game.over:
        candidates = consistent(pool, game.guesses) or list(pool)
        word = rng.choice(list(pool) if rng.random() < noise else candidates)
        game.guess(word)
    return [guess.word for guess in game.guesses]


def game_messages(secret: str, words: Sequence[str]) -> Messages:
    """The agent's transcript of a game played with ``words``: its opening message, then each
    ``guess_word`` call and the feedback the tool answered, ending on the last call."""
    game = WordleGame(secret, allowed_guesses())
    messages: Messages = [{"role": "user", "content": [{"text": OPENING_MESSAGE}]}]
    for index, word in enumerate(words):
        if index:
            messages.append(_result(index - 1, game.guess(words[index - 1])))
        messages.append(_call(index, word))
    return messages


def _call(index: int, word: str) -> Message:
    return {
        "role": "assistant",
        "content": [
            {"toolUse": {"toolUseId": f"call_{index}", "name": "guess_word", "input": {"guess": word}}}
        ],
    }


def _result(index: int, text: str) -> Message:
    return {
        "role": "user",
        "content": [
            {"toolResult": {"toolUseId": f"call_{index}", "status": "success", "content": [{"text": text}]}}
        ],
    }


def game_demonstration(secret: str, words: Sequence[str]) -> dict[str, Any]:
    """One game as ``{"messages": [...], "tools": [...]}`` in OpenAI chat format (``rft sft``'s)."""
    tool_specs = [guess_word_tool(WordleGame(secret, allowed_guesses())).tool_spec]
    request = _formatter().format_request(game_messages(secret, words), tool_specs, SYSTEM_PROMPT)
    return {"messages": request["messages"], "tools": request["tools"]}


def solver_demonstrations(
    secrets: Sequence[str], pool: Sequence[str], *, noise: float, seed: int, end_before_win: bool = False
) -> list[dict[str, Any]]:
    """One demonstration per secret: the noisy solver's game on it (seeded). ``end_before_win``: a won
    game of two or more guesses ends before its winning guess, so no demonstration names its secret."""
    rng = random.Random(f"wordle-solver-{seed}")
    demonstrations = []
    for secret in secrets:
        words = solver_game(secret, pool, rng, noise)
        if end_before_win and len(words) > 1 and words[-1] == secret:
            words = words[:-1]
        demonstrations.append(game_demonstration(secret, words))
    return demonstrations
