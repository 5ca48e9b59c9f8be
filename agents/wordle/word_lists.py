"""The committed SCOWL word lists: secret answers and allowed guesses (see ``build_word_lists.py``)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

WORDS_DIR = Path(__file__).resolve().parent


def _read(name: str) -> tuple[str, ...]:
    path = WORDS_DIR / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: rebuild it with python -m agents.wordle.build_word_lists"
        )
    return tuple(line.strip() for line in path.read_text(encoding="ascii").splitlines() if line.strip())


@cache
def answers() -> tuple[str, ...]:
    """Possible secret words, sorted."""
    return _read("answers.txt")


@cache
def allowed_guesses() -> frozenset[str]:
    """Every word accepted as a guess (a superset of the answers)."""
    return frozenset(_read("allowed.txt"))
