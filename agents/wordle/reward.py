"""The Wordle episode reward: three levels that never overlap, plus shaping inside each level.

With ``q = 1 / (1 + invalid_attempts)`` (1 for a clean game, towards 0 as refused guesses pile up)
and, for a game with ``n`` valid guesses::

    win in n guesses (1..6):   1.05 + 0.09 * (6 - n) + 0.05 * q          in (1.05, 1.55]
    loss (>= 1 valid guess):  -0.5  + 0.20 * info   + 0.05 * q          in (-0.5, -0.25]
    no valid guess:           -1.5  - 0.05 * (1 - q)                    in (-1.55, -1.5]

where ``info = (greens_found + 0.5 * letters_unplaced) / 5`` is how much of the secret the player
had located (positions known green, plus half for each further letter copy known to be present);
it never exceeds 1 because known copies never exceed the secret's five letters.

Why the levels cannot cross: every win is above 1.05, every loss at most -0.25, every no-play at
most -1.5 and every loss above -0.5. Inside a win, each guess saved is worth 0.09, more than the
whole 0.05 shaping band, so a faster win always scores more. A no-play without any tool call scores
exactly -1.5 (what ``rft smoke`` expects when the model endpoint refuses the first call).
"""

from __future__ import annotations

from dataclasses import dataclass

from agents.wordle.game import MAX_GUESSES, WORD_LENGTH, GameStatus, WordleGame

WIN_FLOOR = 1.05
WIN_PER_GUESS_SAVED = 0.09
LOSS_BASE = -0.5
LOSS_INFO_WEIGHT = 0.20
NO_PLAY = -1.5
CLEANLINESS_WEIGHT = 0.05


@dataclass(frozen=True)
class EpisodeFacts:
    """What the reward depends on, taken from a finished (or abandoned) game."""

    won: bool
    valid_guesses: int
    invalid_attempts: int
    greens_found: int
    letters_unplaced: int

    def __post_init__(self) -> None:
        if not 0 <= self.valid_guesses <= MAX_GUESSES:
            raise ValueError(f"valid_guesses must be within 0..{MAX_GUESSES}, got {self.valid_guesses}")
        if self.won and self.valid_guesses == 0:
            raise ValueError("a won game has at least one valid guess")
        if self.invalid_attempts < 0 or self.greens_found < 0 or self.letters_unplaced < 0:
            raise ValueError("counts must be non-negative")
        if self.greens_found + self.letters_unplaced > WORD_LENGTH:
            raise ValueError(f"greens_found + letters_unplaced cannot exceed {WORD_LENGTH}")

    @classmethod
    def from_game(cls, game: WordleGame) -> EpisodeFacts:
        knowledge = game.knowledge()
        return cls(
            won=game.status is GameStatus.WON,
            valid_guesses=len(game.guesses),
            invalid_attempts=game.invalid_attempts,
            greens_found=knowledge.greens_found,
            letters_unplaced=knowledge.letters_unplaced,
        )


def episode_reward(facts: EpisodeFacts) -> float:
    """The reward for one episode (formula in the module docstring)."""
    cleanliness = 1.0 / (1 + facts.invalid_attempts)
    if facts.won:
        saved = MAX_GUESSES - facts.valid_guesses
        return WIN_FLOOR + WIN_PER_GUESS_SAVED * saved + CLEANLINESS_WEIGHT * cleanliness
    if facts.valid_guesses > 0:
        info = (facts.greens_found + 0.5 * facts.letters_unplaced) / WORD_LENGTH
        return LOSS_BASE + LOSS_INFO_WEIGHT * info + CLEANLINESS_WEIGHT * cleanliness
    return NO_PLAY - CLEANLINESS_WEIGHT * (1.0 - cleanliness)


def game_reward(game: WordleGame) -> float:
    """The reward for a game as it stands (a game ended early is scored like a finished one)."""
    return episode_reward(EpisodeFacts.from_game(game))
