"""Rebuild ``answers.txt``, ``allowed.txt`` and ``SCOWL-COPYRIGHT.txt`` from Debian's ``scowl`` package.

The committed lists come from SCOWL 2020.12.07 (``apt-get install scowl``)::

    python -m agents.wordle.build_word_lists [--scowl-dir /usr/share/dict/scowl] [--out-dir agents/wordle]

Answers are the common words (size levels up to :data:`ANSWER_MAX_LEVEL`); allowed guesses add the
larger levels up to :data:`ALLOWED_MAX_LEVEL`. Only the ``english-words`` and ``american-words`` lists
are read (no proper names, abbreviations or contractions), and only words of exactly five lowercase
ASCII letters are kept, which also drops capitalised words, possessives and accented spellings.
"""

from __future__ import annotations

import argparse
import gzip
import re
from pathlib import Path

SCOWL_DIR = Path("/usr/share/dict/scowl")
SCOWL_README = Path("/usr/share/doc/scowl/README.gz")
OUT_DIR = Path(__file__).resolve().parent
LEVELS = (10, 20, 35, 40, 50, 55, 60, 70)
ANSWER_MAX_LEVEL = 35
ALLOWED_MAX_LEVEL = 70
LIST_KINDS = ("english-words", "american-words")
FIVE_LETTERS = re.compile(r"[a-z]{5}")
COPYRIGHT_START = "COPYRIGHT, SOURCES, and CREDITS:"
COPYRIGHT_END = "FUTURE PLANS:"


def read_level(scowl_dir: Path, max_level: int) -> set[str]:
    """Five-letter lowercase words from every list kind at levels up to ``max_level``."""
    words: set[str] = set()
    for kind in LIST_KINDS:
        for level in (lv for lv in LEVELS if lv <= max_level):
            path = scowl_dir / f"{kind}.{level}"
            if not path.is_file():
                raise FileNotFoundError(
                    f"{path} is missing: install Debian's scowl package (apt-get install scowl)"
                )
            # Upstream ships ISO-8859-1, Debian UTF-8; latin-1 decodes both without error and any
            # non-ASCII byte fails the five-letter pattern either way.
            for line in path.read_text(encoding="latin-1").splitlines():
                word = line.strip()
                if FIVE_LETTERS.fullmatch(word):
                    words.add(word)
    return words


def copyright_text(readme_gz: Path) -> str:
    """SCOWL's "COPYRIGHT, SOURCES, and CREDITS" section (the text of its upstream Copyright file)."""
    readme = gzip.decompress(readme_gz.read_bytes()).decode("utf-8")
    start = readme.index(COPYRIGHT_START)
    end = readme.index(COPYRIGHT_END, start)
    version = readme.splitlines()[1].strip()
    header = (
        f"The Wordle word lists (answers.txt, allowed.txt) are derived from SCOWL ({version}),\n"
        "http://wordlist.aspell.net/, as packaged by Debian (scowl 2020.12.07). SCOWL's notice follows.\n\n"
    )
    return header + readme[start:end].rstrip() + "\n"


def build(scowl_dir: Path, readme_gz: Path, out_dir: Path) -> tuple[int, int]:
    """Write the three files; returns (number of answers, number of allowed guesses)."""
    answers = read_level(scowl_dir, ANSWER_MAX_LEVEL)
    allowed = read_level(scowl_dir, ALLOWED_MAX_LEVEL) | answers
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "answers.txt").write_text("\n".join(sorted(answers)) + "\n", encoding="ascii")
    (out_dir / "allowed.txt").write_text("\n".join(sorted(allowed)) + "\n", encoding="ascii")
    (out_dir / "SCOWL-COPYRIGHT.txt").write_text(copyright_text(readme_gz), encoding="utf-8")
    return len(answers), len(allowed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scowl-dir", type=Path, default=SCOWL_DIR)
    parser.add_argument("--readme", type=Path, default=SCOWL_README, help="SCOWL's README.gz")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    n_answers, n_allowed = build(args.scowl_dir, args.readme, args.out_dir)
    print(f"wrote {n_answers} answers and {n_allowed} allowed guesses to {args.out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
