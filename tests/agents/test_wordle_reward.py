"""The Wordle reward: every branch, and levels that never overlap over the whole range."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.wordle.game import MAX_GUESSES, WordleGame
from agents.wordle.reward import EpisodeFacts, episode_reward, game_reward
from agents.wordle.word_lists import allowed_guesses


def facts(
    won: bool = False, valid: int = 0, invalid: int = 0, greens: int = 0, unplaced: int = 0
) -> EpisodeFacts:
    return EpisodeFacts(
        won=won, valid_guesses=valid, invalid_attempts=invalid, greens_found=greens, letters_unplaced=unplaced
    )


def test_win_rewards_run_from_1_05_to_1_55_and_faster_is_more() -> None:
    clean = [episode_reward(facts(won=True, valid=n, greens=5)) for n in range(1, MAX_GUESSES + 1)]
    assert clean[0] == pytest.approx(1.55)
    assert clean[-1] == pytest.approx(1.10)
    assert all(a > b for a, b in zip(clean, clean[1:], strict=False))
    sloppy_slowest = episode_reward(facts(won=True, valid=6, invalid=10**9, greens=5))
    assert sloppy_slowest == pytest.approx(1.05, abs=1e-6) and sloppy_slowest > 1.05


def test_win_shaping_prefers_fewer_invalid_attempts_but_never_beats_a_faster_win() -> None:
    assert episode_reward(facts(won=True, valid=3, greens=5)) > episode_reward(
        facts(won=True, valid=3, invalid=1)
    )
    worst_fast = episode_reward(facts(won=True, valid=2, invalid=10**6, greens=5))
    best_slow = episode_reward(facts(won=True, valid=3, greens=5))
    assert worst_fast > best_slow


def test_loss_is_minus_0_5_plus_information_found() -> None:
    nothing = episode_reward(facts(valid=6, invalid=10**9))
    assert nothing == pytest.approx(-0.5, abs=1e-6) and nothing > -0.5
    assert episode_reward(facts(valid=6)) == pytest.approx(-0.45)
    assert episode_reward(facts(valid=6, greens=2, unplaced=2)) == pytest.approx(-0.5 + 0.2 * 0.6 + 0.05)
    assert episode_reward(facts(valid=6, greens=5)) == pytest.approx(-0.25)
    assert episode_reward(facts(valid=6, greens=3)) > episode_reward(facts(valid=6, greens=2, unplaced=1))
    assert episode_reward(facts(valid=6, greens=2, unplaced=1)) > episode_reward(facts(valid=6, greens=2))
    assert episode_reward(facts(valid=2, greens=1)) > episode_reward(facts(valid=2, greens=1, invalid=3))


def test_no_valid_guess_is_minus_1_5_and_invalid_attempts_lower_it() -> None:
    assert episode_reward(facts()) == -1.5
    assert episode_reward(facts(invalid=1)) == pytest.approx(-1.525)
    assert episode_reward(facts(invalid=19)) < episode_reward(facts(invalid=1))
    assert episode_reward(facts(invalid=10**9)) > -1.55


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"valid": 7}, "valid_guesses"),
        ({"won": True, "valid": 0}, "at least one valid guess"),
        ({"valid": 1, "invalid": -1}, "non-negative"),
        ({"valid": 1, "greens": 4, "unplaced": 2}, "cannot exceed 5"),
    ],
)
def test_impossible_facts_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        facts(**kwargs)


@st.composite
def episodes(draw: st.DrawFn) -> EpisodeFacts:
    level = draw(st.sampled_from(["win", "loss", "no-play"]))
    invalid = draw(st.one_of(st.integers(0, 30), st.integers(0, 10**12)))
    if level == "no-play":
        return facts(invalid=invalid)
    greens = draw(st.integers(0, 5))
    unplaced = draw(st.integers(0, 5 - greens))
    if level == "win":
        return facts(won=True, valid=draw(st.integers(1, MAX_GUESSES)), invalid=invalid, greens=5)
    return facts(valid=draw(st.integers(1, MAX_GUESSES)), invalid=invalid, greens=greens, unplaced=unplaced)


def level_of(episode: EpisodeFacts) -> int:
    return 2 if episode.won else 1 if episode.valid_guesses else 0


@settings(max_examples=3000, deadline=None)
@given(a=episodes(), b=episodes())
def test_levels_never_overlap(a: EpisodeFacts, b: EpisodeFacts) -> None:
    ra, rb = episode_reward(a), episode_reward(b)
    assert math.isfinite(ra) and math.isfinite(rb)
    if level_of(a) > level_of(b):
        assert ra > rb
    for episode, reward in ((a, ra), (b, rb)):
        if episode.won:
            assert 1.05 < reward <= 1.55 + 1e-12
        elif episode.valid_guesses:
            assert -0.5 < reward <= -0.25 + 1e-12
        else:
            assert -1.55 < reward <= -1.5


@settings(max_examples=500, deadline=None)
@given(valid=st.integers(1, MAX_GUESSES - 1), inv_fast=st.integers(0, 10**9), inv_slow=st.integers(0, 10**9))
def test_a_faster_win_always_scores_more(valid: int, inv_fast: int, inv_slow: int) -> None:
    fast = episode_reward(facts(won=True, valid=valid, invalid=inv_fast, greens=5))
    slow = episode_reward(facts(won=True, valid=valid + 1, invalid=inv_slow, greens=5))
    assert fast > slow


def test_game_reward_reads_the_game() -> None:
    game = WordleGame("abbey", allowed_guesses())
    assert game_reward(game) == -1.5
    game.guess("zzzzz")
    assert game_reward(game) == pytest.approx(-1.525)
    game.guess("babes")  # greens B, E; A and one more B known but unplaced
    assert game_reward(game) == pytest.approx(-0.5 + 0.2 * (2 + 0.5 * 2) / 5 + 0.05 / 2)
    game.guess("abbey")
    assert game_reward(game) == pytest.approx(1.05 + 0.09 * 4 + 0.05 / 2)
