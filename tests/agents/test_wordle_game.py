"""Wordle rules: scoring with duplicate letters, the knowledge summary, invalid words, the limits."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.wordle.game import (
    MAX_GUESSES,
    GameStatus,
    InvalidGuess,
    Knowledge,
    Mark,
    ScoredGuess,
    WordleGame,
    score_guess,
    validate_guess,
)
from agents.wordle.word_lists import allowed_guesses, answers

G, Y, X = Mark.GREEN, Mark.YELLOW, Mark.GRAY


@pytest.mark.parametrize(
    ("secret", "guess", "expected"),
    [
        # Greens are taken first: the B at position 3 is green, so only one B is left for a yellow.
        ("abbey", "babes", (Y, Y, G, G, X)),
        ("abbey", "kebab", (X, Y, G, Y, Y)),
        # The secret has one E: the first E of the guess takes it as yellow, the second is gray.
        ("abide", "speed", (X, X, Y, X, Y)),
        ("speed", "abide", (X, X, X, Y, Y)),
        # A green E uses the secret's only E, so the earlier E of the guess is gray, not yellow.
        ("crane", "eerie", (X, X, Y, X, G)),
        ("crane", "crane", (G, G, G, G, G)),
        ("crane", "pilot", (X, X, X, X, X)),
        ("geese", "eerie", (Y, G, X, X, G)),
    ],
)
def test_score_guess_handles_duplicate_letters(secret: str, guess: str, expected: tuple[Mark, ...]) -> None:
    assert score_guess(secret, guess) == expected


def test_score_guess_rejects_length_mismatch() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        score_guess("crane", "cranes")


five_letter = st.text(alphabet="abcde", min_size=5, max_size=5)


@settings(max_examples=300, deadline=None)
@given(secret=five_letter, guess=five_letter)
def test_scoring_never_marks_more_copies_than_the_secret_holds(secret: str, guess: str) -> None:
    marks = score_guess(secret, guess)
    counted: Counter[str] = Counter(g for g, mark in zip(guess, marks, strict=True) if mark is not Mark.GRAY)
    for letter, count in counted.items():
        assert count <= secret.count(letter)
    # And as many as possible: a gray copy means every copy in the secret is already marked.
    for g, mark in zip(guess, marks, strict=True):
        if mark is Mark.GRAY:
            assert counted[g] == secret.count(g)
    for i, (s, g) in enumerate(zip(secret, guess, strict=True)):
        assert (marks[i] is Mark.GREEN) == (s == g)


def test_knowledge_summary_names_greens_unplaced_and_absent_letters() -> None:
    guesses = [ScoredGuess(w, score_guess("abbey", w)) for w in ("babes", "kebab")]
    knowledge = Knowledge.from_guesses(guesses)
    assert knowledge.greens == {2: "b", 3: "e"}
    assert knowledge.unplaced() == {"a": 1, "b": 1}
    assert knowledge.absent == frozenset({"s", "k"})
    assert knowledge.summary() == (
        "Correct positions: position 3 is B, position 4 is E.\n"
        "In the word but not yet placed: A, not at position 2; B, not at position 1, 5.\n"
        "Not in the word: K, S."
    )


def test_a_gray_duplicate_does_not_make_a_present_letter_absent() -> None:
    knowledge = Knowledge.from_guesses([ScoredGuess("speed", score_guess("abide", "speed"))])
    assert "e" not in knowledge.absent
    assert knowledge.unplaced() == {"d": 1, "e": 1}
    assert knowledge.absent == frozenset({"s", "p"})


def test_knowledge_counts_multiple_unplaced_copies() -> None:
    knowledge = Knowledge.from_guesses([ScoredGuess("eerie", score_guess("geese", "eerie"))])
    # E is green at positions 2 and 5 and yellow once more: three E's, two placed, one unplaced.
    assert knowledge.greens == {1: "e", 4: "e"}
    assert knowledge.unplaced() == {"e": 1}
    assert knowledge.letters_unplaced == 1
    assert knowledge.greens_found == 2


def test_empty_knowledge_summary() -> None:
    assert Knowledge.from_guesses([]).summary() == (
        "Correct positions: none yet.\n"
        "In the word but not yet placed: none known.\n"
        "Not in the word: none known."
    )


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("cat", "has 3 characters"),
        ("cranes", "has 6 characters"),
        ("cr4ne", "other than the letters a-z"),
        ("crâne", "other than the letters a-z"),
        ("zzzzz", "not in the word list"),
        (42, "must be a word"),
    ],
)
def test_validate_guess_refuses_with_a_reason(raw: object, reason: str) -> None:
    with pytest.raises(InvalidGuess, match=reason):
        validate_guess(raw, allowed_guesses())


def test_validate_guess_normalises_case_and_spaces() -> None:
    assert validate_guess("  CRANE ", allowed_guesses()) == "crane"


def test_invalid_words_do_not_spend_guesses() -> None:
    game = WordleGame("crane", allowed_guesses())
    for raw in ("cat", "zzzzz", "cr4ne", "cranes"):
        text = game.guess(raw)
        assert text.startswith("Invalid guess:")
        assert "you have 6 left" in text
    assert game.guesses == []
    assert game.invalid_attempts == 4
    assert game.status is GameStatus.PLAYING
    assert game.guess("pilot").startswith("Guess 1 of 6: PILOT")


def test_win_ends_the_game() -> None:
    game = WordleGame("crane", allowed_guesses())
    game.guess("pilot")
    text = game.guess("Crane")
    assert "You solved it in 2 guesses" in text
    assert game.status is GameStatus.WON and game.over
    assert game.guess("plane") == "The game is over: you already solved it."
    assert len(game.guesses) == 2


def test_six_guesses_then_the_game_is_lost() -> None:
    game = WordleGame("crane", allowed_guesses())
    for i in range(MAX_GUESSES - 1):
        text = game.guess("pilot")
        assert f"Guesses left: {MAX_GUESSES - 1 - i}." in text
        assert not game.over
    text = game.guess("pilot")
    assert "That was your last guess. The word was CRANE." in text
    assert game.status is GameStatus.LOST and game.over
    assert game.guess("crane") == "The game is over: no guesses left. The word was CRANE."
    assert len(game.guesses) == MAX_GUESSES


def test_tool_call_cap_ends_a_looping_game() -> None:
    game = WordleGame("crane", allowed_guesses(), max_tool_calls=5)
    for _ in range(4):
        game.guess("zzzzz")
        assert not game.over
    text = game.guess("zzzzz")
    assert text.endswith("You have used all 5 tool calls. The game is over.")
    assert game.over and game.status is GameStatus.PLAYING
    assert game.guess("crane") == "The game is over: you have used all 5 tool calls."
    assert game.guesses == [] and game.tool_calls == 6


def test_game_refuses_a_secret_outside_the_word_list() -> None:
    with pytest.raises(ValueError, match="not in the allowed word list"):
        WordleGame("qzxjv", allowed_guesses())
    with pytest.raises(ValueError, match="5 lowercase letters"):
        WordleGame("cranes", allowed_guesses())


def test_word_lists_are_five_lowercase_letters_and_answers_are_allowed() -> None:
    assert len(answers()) > 2000
    assert all(len(w) == 5 and w.isascii() and w.isalpha() and w.islower() for w in allowed_guesses())
    assert set(answers()) <= allowed_guesses()
    assert len(allowed_guesses()) > len(answers())
    assert {"crane", "abbey", "speed", "abide"} <= allowed_guesses()
