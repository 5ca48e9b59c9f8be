"""The Wordle reference agent: a Strands agent with one tool, ``guess_word``, rewarded inside the agent.

Each rollout's row carries only the secret (``{"secret": "crane"}``, or that object as a JSON
string). The model never sees it: it plays through ``guess_word`` and reads the feedback. The reward
(see ``reward.py``) is computed here from the game, so it never leaves the agent unscored.

Run locally with ``python agents/wordle/main.py`` (port 8080), then ``rft smoke http://localhost:8080``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from strands import Agent, ToolContext, tool
from strands.agent.conversation_manager import NullConversationManager
from strands.tools.executors import SequentialToolExecutor
from strands.types.tools import AgentTool

from agents.wordle.game import MAX_GUESSES, MAX_TOOL_CALLS, WORD_LENGTH, GameStatus, WordleGame
from agents.wordle.reward import game_reward
from agents.wordle.word_lists import allowed_guesses
from handlers import InvalidRowError, RolloutContext, ends_episode, rft_app

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = f"""You are playing Wordle. A secret {WORD_LENGTH}-letter English word has been chosen.
Find it in at most {MAX_GUESSES} guesses.

Make each guess by calling the guess_word tool with one {WORD_LENGTH}-letter English word. For every
letter the tool answers:
- green: the letter is in the word at this position;
- yellow: the letter is in the word, but at another position;
- gray: the letter is not in the word (or not as many times as you used it).
It then summarises everything known so far. A word that is not a real {WORD_LENGTH}-letter word is
refused and does not use up a guess, but you may call the tool at most {MAX_TOOL_CALLS} times in all.

Use what you learn: keep green letters in place, move yellow letters, avoid gray letters.
Make one guess per tool call and keep going until you solve the word or run out of guesses."""

OPENING_MESSAGE = "Let's play Wordle. Make your first guess with the guess_word tool."


class UnknownSecretError(InvalidRowError):
    """The row does not name a secret this agent can play."""


def parse_secret(row: Any) -> str:
    """The secret word from a row: ``{"secret": "crane"}`` or that object as a JSON string."""
    if isinstance(row, str):
        try:
            row = json.loads(row)
        except json.JSONDecodeError as error:
            raise UnknownSecretError(
                f'the prompt must be a JSON object like {{"secret": "crane"}}: {error}'
            ) from error
    if not isinstance(row, dict) or not isinstance(row.get("secret"), str):
        raise UnknownSecretError(f'the prompt must be an object like {{"secret": "crane"}}, got {row!r}')
    secret = row["secret"].strip().lower()
    if secret not in allowed_guesses():
        raise UnknownSecretError(
            f"the secret {row['secret']!r} is not a {WORD_LENGTH}-letter word in the Wordle word list"
        )
    return secret


def guess_word_tool(game: WordleGame) -> AgentTool:
    """The ``guess_word`` tool bound to one game; it stops the agent once the game is over."""

    @tool(name="guess_word", context=True)
    def guess_word(guess: str, tool_context: ToolContext) -> str:
        """Guess the secret word and get per-letter feedback.

        Args:
            guess: one 5-letter English word.
        """
        feedback = game.guess(guess)
        if game.over:
            # Let the rest of this tool batch answer, then end without another model call.
            tool_context.agent.cancel(after_current_tools=True)
        return feedback

    return guess_word


async def rollout(row: Any, ctx: RolloutContext) -> dict[str, Any]:
    """Play one game against the policy and return its reward with a few metrics."""
    game = WordleGame(parse_secret(row), allowed_guesses())
    agent = Agent(
        model=ctx.strands_model(),
        tools=[guess_word_tool(game)],
        system_prompt=SYSTEM_PROMPT,
        # Keep the transcript whole: the trainer needs each prompt to extend the previous one.
        conversation_manager=NullConversationManager(),
        # Guesses in one batch are played in order, not concurrently.
        tool_executor=SequentialToolExecutor(),
        callback_handler=None,
    )
    try:
        await agent.invoke_async(OPENING_MESSAGE)
    except Exception as error:
        if not ends_episode(error):
            raise
        logger.info("rollout %s ended by the model endpoint: %s", ctx.rollout_id, error)
    reward = game_reward(game)
    logger.info(
        "rollout %s: secret %s, %s after %d guesses (%d invalid), reward %.3f",
        ctx.rollout_id,
        game.secret,
        game.status,
        len(game.guesses),
        game.invalid_attempts,
        reward,
    )
    return {
        "reward": reward,
        "metrics": {
            "solved": float(game.status is GameStatus.WON),
            "guesses": float(len(game.guesses)),
            "invalid_attempts": float(game.invalid_attempts),
            "tool_calls": float(game.tool_calls),
        },
    }


app = rft_app(rollout, row_format="json")

if __name__ == "__main__":
    app.run()
