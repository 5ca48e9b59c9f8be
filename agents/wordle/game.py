"""Wordle rules: scoring a guess, what the player knows, and one game's state.

Rules: the secret is a 5-letter word; the player has :data:`MAX_GUESSES` guesses. Each letter of a
guess is marked green (right letter, right place), yellow (in the word, elsewhere) or gray. Duplicate
letters follow the standard rule: greens are marked first, then yellows left to right, each using up
one of the secret's remaining copies of that letter; further copies are gray. A guess that is not an
allowed word (wrong length, non-letters, not in the list) is refused without spending a guess. Every
call of the guess tool counts towards :data:`MAX_TOOL_CALLS`, so a model that keeps calling (valid or
not) ends the episode.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from enum import StrEnum

WORD_LENGTH = 5
MAX_GUESSES = 6
MAX_TOOL_CALLS = 20


class Mark(StrEnum):
    GREEN = "green"
    YELLOW = "yellow"
    GRAY = "gray"


class GameStatus(StrEnum):
    PLAYING = "playing"
    WON = "won"
    LOST = "lost"


def score_guess(secret: str, guess: str) -> tuple[Mark, ...]:
    """Per-letter marks for ``guess`` against ``secret`` (same length, lowercase)."""
    if len(secret) != len(guess):
        raise ValueError(f"secret and guess differ in length: {len(secret)} vs {len(guess)}")
    marks = [Mark.GRAY] * len(guess)
    remaining: Counter[str] = Counter()
    for i, (s, g) in enumerate(zip(secret, guess, strict=True)):
        if s == g:
            marks[i] = Mark.GREEN
        else:
            remaining[s] += 1
    for i, g in enumerate(guess):
        if marks[i] is not Mark.GREEN and remaining[g] > 0:
            marks[i] = Mark.YELLOW
            remaining[g] -= 1
    return tuple(marks)


@dataclass(frozen=True)
class ScoredGuess:
    word: str
    marks: tuple[Mark, ...]

    @property
    def solved(self) -> bool:
        return all(mark is Mark.GREEN for mark in self.marks)

    def describe(self) -> str:
        """E.g. ``B yellow, A yellow, B green, E green, S gray``."""
        return ", ".join(
            f"{letter.upper()} {mark}" for letter, mark in zip(self.word, self.marks, strict=True)
        )


@dataclass(frozen=True)
class Knowledge:
    """What a sequence of scored guesses proves about the secret."""

    greens: dict[int, str]
    min_counts: dict[str, int]
    not_at: dict[str, frozenset[int]]
    absent: frozenset[str]

    @classmethod
    def from_guesses(cls, guesses: list[ScoredGuess]) -> Knowledge:
        greens: dict[int, str] = {}
        min_counts: dict[str, int] = {}
        not_at: dict[str, set[int]] = {}
        grayed: set[str] = set()
        for guess in guesses:
            found: Counter[str] = Counter()
            for i, (letter, mark) in enumerate(zip(guess.word, guess.marks, strict=True)):
                if mark is Mark.GREEN:
                    greens[i] = letter
                    found[letter] += 1
                else:
                    # A yellow or a gray letter is not at this position either way.
                    not_at.setdefault(letter, set()).add(i)
                    if mark is Mark.YELLOW:
                        found[letter] += 1
                    else:
                        grayed.add(letter)
            for letter, count in found.items():
                min_counts[letter] = max(min_counts.get(letter, 0), count)
        return cls(
            greens=dict(sorted(greens.items())),
            min_counts=min_counts,
            not_at={letter: frozenset(pos) for letter, pos in not_at.items()},
            absent=frozenset(grayed - set(min_counts)),
        )

    @property
    def greens_found(self) -> int:
        """Positions whose letter is known."""
        return len(self.greens)

    def unplaced(self) -> dict[str, int]:
        """Letters known to be in the word beyond the known greens, with how many such copies."""
        placed = Counter(self.greens.values())
        return {
            letter: count - placed[letter]
            for letter, count in sorted(self.min_counts.items())
            if count > placed[letter]
        }

    @property
    def letters_unplaced(self) -> int:
        return sum(self.unplaced().values())

    def summary(self) -> str:
        """Plain-language lines: correct positions, letters present elsewhere, letters absent."""
        if self.greens:
            known = ", ".join(f"position {i + 1} is {letter.upper()}" for i, letter in self.greens.items())
        else:
            known = "none yet"
        lines = [f"Correct positions: {known}."]
        unplaced = self.unplaced()
        if unplaced:
            parts = []
            for letter, copies in unplaced.items():
                positions = sorted(
                    p + 1 for p in self.not_at.get(letter, frozenset()) if p not in self.greens
                )
                where = (
                    f"not at position {', '.join(map(str, positions))}" if positions else "position unknown"
                )
                extra = f" ({copies} copies)" if copies > 1 else ""
                parts.append(f"{letter.upper()}{extra}, {where}")
            lines.append("In the word but not yet placed: " + "; ".join(parts) + ".")
        else:
            lines.append("In the word but not yet placed: none known.")
        absent = ", ".join(sorted(letter.upper() for letter in self.absent)) or "none known"
        lines.append(f"Not in the word: {absent}.")
        return "\n".join(lines)


class InvalidGuess(ValueError):
    """A guess refused without spending a turn; the message tells the player why."""


def validate_guess(raw: object, allowed: Collection[str]) -> str:
    """The normalised (stripped, lowercase) word, or :class:`InvalidGuess` saying what is wrong."""
    if not isinstance(raw, str):
        raise InvalidGuess(f"the guess must be a word (text), not {type(raw).__name__}")
    word = raw.strip().lower()
    if len(word) != WORD_LENGTH:
        raise InvalidGuess(
            f"{raw!r} has {len(word)} characters; a guess must be exactly {WORD_LENGTH} letters"
        )
    if not (word.isascii() and word.isalpha()):
        raise InvalidGuess(f"{raw!r} contains characters other than the letters a-z")
    if word not in allowed:
        raise InvalidGuess(f"{word.upper()} is not in the word list")
    return word


@dataclass
class WordleGame:
    """One episode. :meth:`guess` is what the tool calls; it returns the text the model reads."""

    secret: str
    allowed: Collection[str]
    max_guesses: int = MAX_GUESSES
    max_tool_calls: int = MAX_TOOL_CALLS
    guesses: list[ScoredGuess] = field(default_factory=list)
    invalid_attempts: int = 0
    tool_calls: int = 0

    def __post_init__(self) -> None:
        if len(self.secret) != WORD_LENGTH or not (self.secret.isascii() and self.secret.isalpha()):
            raise ValueError(f"the secret must be {WORD_LENGTH} lowercase letters, got {self.secret!r}")
        if self.secret not in self.allowed:
            raise ValueError(f"the secret {self.secret!r} is not in the allowed word list")

    @property
    def status(self) -> GameStatus:
        if self.guesses and self.guesses[-1].solved:
            return GameStatus.WON
        if len(self.guesses) >= self.max_guesses:
            return GameStatus.LOST
        return GameStatus.PLAYING

    @property
    def tool_calls_exhausted(self) -> bool:
        return self.tool_calls >= self.max_tool_calls

    @property
    def over(self) -> bool:
        """True once the game is won or lost, or the tool-call cap is reached."""
        return self.status is not GameStatus.PLAYING or self.tool_calls_exhausted

    @property
    def guesses_left(self) -> int:
        return self.max_guesses - len(self.guesses)

    def knowledge(self) -> Knowledge:
        return Knowledge.from_guesses(self.guesses)

    def guess(self, raw: object) -> str:
        """Play one tool call and return the feedback text."""
        if self.over:
            self.tool_calls += 1
            return self._over_text()
        self.tool_calls += 1
        try:
            word = validate_guess(raw, self.allowed)
        except InvalidGuess as error:
            self.invalid_attempts += 1
            text = f"Invalid guess: {error}. This did not use a guess; you have {self.guesses_left} left."
            return self._with_cap_notice(text)
        scored = ScoredGuess(word, score_guess(self.secret, word))
        self.guesses.append(scored)
        number = len(self.guesses)
        text = f"Guess {number} of {self.max_guesses}: {word.upper()} -> {scored.describe()}."
        if self.status is GameStatus.WON:
            plural = "guess" if number == 1 else "guesses"
            return f"{text}\nYou solved it in {number} {plural}! The game is over."
        if self.status is GameStatus.LOST:
            return f"{text}\nThat was your last guess. The word was {self.secret.upper()}. The game is over."
        text = f"{text}\n{self.knowledge().summary()}\nGuesses left: {self.guesses_left}."
        return self._with_cap_notice(text)

    def _with_cap_notice(self, text: str) -> str:
        if self.tool_calls_exhausted:
            return f"{text}\nYou have used all {self.max_tool_calls} tool calls. The game is over."
        return text

    def _over_text(self) -> str:
        if self.status is GameStatus.WON:
            return "The game is over: you already solved it."
        if self.status is GameStatus.LOST:
            return f"The game is over: no guesses left. The word was {self.secret.upper()}."
        return f"The game is over: you have used all {self.max_tool_calls} tool calls."
