"""Does a warm-started Wordle policy read the feedback? Its surprise at a perfect player's guesses.

A player that reads the feedback and picks uniformly among the pool words still consistent with it
(the noise-free solver) is surprised by its own guess by ``log |consistent|`` nats: ``log |pool|`` at
the first guess, about 0.2 by the fourth. A policy that learned only "some word of the pool" stays at
``log |pool|`` on every guess. This measures, on held-out secrets, the policy's ``-log p(word)`` of
the noise-free solver's guesses, guess by guess, beside those two bounds: one teacher-forced pass
per game, seconds for a tiny model.

    .venv/bin/python -m agents.wordle.demo.feedback RUN [--games 40]
    .venv/bin/python -m agents.wordle.demo.feedback --model DIR --chat-template chatml-tools [--plan smollm2]

``RUN``: a finished ``rft demo --task wordle`` run directory (its ``results.json`` plan and seed give
the pool; ``model/``, ``sft-adapter/`` and ``data/``); ``--adapter`` names another adapter (the final
``adapter/``, say), ``--model`` the base model of a run on ``--model DIR``. Without ``RUN``, ``--model``
is measured as shipped (or with ``--adapter``) on the pool and validation secrets ``--plan`` and
``--seed`` give the demo: whether a model reads the feedback before any training is spent on it.
``--chat-template``: the template the run used when it was not the model's own (``chatml-tools`` for
SmolLM2), so the games render as the policy saw them.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agents.wordle.demo.plans import NAMED_PLANS, WordlePlan
from agents.wordle.demo.solver import consistent, game_demonstration, solver_game
from agents.wordle.game import ScoredGuess, score_guess
from agents.wordle.main import OPENING_MESSAGE

# The printed table's columns and widths.
FIELDS = (("guess", 5), ("games", 5), ("policy_nats", 11), ("reader_nats", 11), ("pool_nats", 9))


def guess_spans(text: str, words: Sequence[str]) -> list[tuple[int, int]]:
    """Where each guessed word stands in a rendered game: the calls' arguments, in order, after the
    opening message (the feedback spells guesses in capitals, so a lower-case match is a call's)."""
    spans, at = [], text.index(OPENING_MESSAGE)
    for word in words:
        start = text.index(word, at)
        spans.append((start, start + len(word)))
        at = start + len(word)
    return spans


def game_surprise(model: Any, tokenizer: Any, secret: str, words: Sequence[str]) -> list[float]:
    """``-log p(word)`` of each guess of a game the policy is shown whole (teacher forcing)."""
    import torch

    demonstration = game_demonstration(secret, words)
    text = tokenizer.apply_chat_template(
        demonstration["messages"], tools=demonstration["tools"], tokenize=False
    )
    encoded = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    ids = torch.tensor([encoded["input_ids"]])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
    token_logprobs = logprobs.gather(-1, ids[0, 1:, None])[:, 0]
    surprises = []
    for start, stop in guess_spans(text, words):
        tokens = [i for i, (s, e) in enumerate(encoded["offset_mapping"]) if s < stop and e > start]
        surprises.append(-sum(token_logprobs[i - 1].item() for i in tokens))
    return surprises


def feedback_reading(
    model: Any, tokenizer: Any, pool: Sequence[str], secrets: Sequence[str], seed: int = 0
) -> list[dict[str, float]]:
    """Per guess number: games reaching it, the policy's mean ``-log p(word)`` of the noise-free
    solver's guess, and the mean ``log |consistent|`` a perfect reader would have (nats)."""
    rng = random.Random(f"wordle-feedback-{seed}")
    rows: dict[int, list[tuple[float, float]]] = {}
    for secret in secrets:
        words = solver_game(secret, pool, rng, noise=0.0)
        scored: list[ScoredGuess] = []
        for number, (word, surprise) in enumerate(
            zip(words, game_surprise(model, tokenizer, secret, words), strict=True)
        ):
            rows.setdefault(number + 1, []).append((surprise, math.log(len(consistent(pool, scored)))))
            scored.append(ScoredGuess(word, score_guess(secret, word)))
    return [
        {
            "guess": number,
            "games": len(pairs),
            "policy_nats": round(sum(p for p, _ in pairs) / len(pairs), 3),
            "reader_nats": round(sum(r for _, r in pairs) / len(pairs), 3),
            "pool_nats": round(math.log(len(pool)), 3),
        }
        for number, pairs in sorted(rows.items())
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, nargs="?", help="a finished `rft demo --task wordle` run directory")
    parser.add_argument("--adapter", type=Path, help="the adapter to measure (default: RUN/sft-adapter)")
    parser.add_argument("--model", type=Path, help="the base model (default: RUN/model, the tiny one)")
    parser.add_argument(
        "--plan",
        choices=[name.replace(" ", "-") for name in NAMED_PLANS],
        default="smollm2",
        help="without RUN: the plan whose pool and validation secrets to play (default smollm2)",
    )
    parser.add_argument("--seed", type=int, default=0, help="without RUN: the demo's seed (default 0)")
    parser.add_argument("--chat-template", help="a shipped template's name or a file, as rft demo takes")
    parser.add_argument("--games", type=int, default=40, help="held-out secrets played (default 40)")
    args = parser.parse_args(argv)
    if args.run is None and args.model is None:
        parser.error("give a run directory, or --model (a base model measured as shipped, or with --adapter)")
    from transformers import AutoModelForCausalLM

    from policy_server.models import load_tokenizer

    model_dir, adapter, pool, validation = _inputs(args)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    tokenizer = load_tokenizer(model_dir, args.chat_template)
    print(f"{'guess':>5} {'games':>5} {'policy nats':>11} {'reader nats':>11} {'pool nats':>9}")
    for row in feedback_reading(model.eval(), tokenizer, pool, validation[: args.games]):
        print(" ".join(f"{row[key]:>{width}}" for key, width in FIELDS))
    return 0


def _inputs(args: argparse.Namespace) -> tuple[Path, Path | None, list[str], list[str]]:
    """The model, the adapter (None: the model as it is), the pool and the validation secrets."""
    from agents.wordle.dataset import VALIDATION_FILE
    from agents.wordle.demo.model import secret_split

    if args.run is None:
        pool, _, validation = secret_split(NAMED_PLANS[args.plan.replace("-", " ")], args.seed)
        return args.model, args.adapter, pool, validation
    results = json.loads((args.run / "results.json").read_text())
    pool, _, _ = secret_split(WordlePlan(**results["plan"]), results["seed"])
    lines = (args.run / "data" / VALIDATION_FILE).read_text().splitlines()
    validation = [json.loads(line)["secret"] for line in lines]
    return args.model or args.run / "model", args.adapter or args.run / "sft-adapter", pool, validation


if __name__ == "__main__":
    raise SystemExit(main())
