"""``python -m agents.wordle.demo.feedback``: a Wordle policy's surprise at a perfect player's guesses,
beside what a perfect feedback reader and a pool-only guesser would have (docs/wordle.md)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from agents.wordle.demo.feedback import FIELDS, feedback_reading, game_surprise, guess_spans, main
from agents.wordle.demo.model import build_model, secret_split
from agents.wordle.demo.plans import QUICK
from agents.wordle.demo.solver import game_demonstration, solver_demonstrations, solver_game

PLAN = QUICK


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], list[str]]:
    """The quick plan's tiny model, random (no warm start), its pool and validation secrets."""
    pool, train, validation = secret_split(PLAN, 0)
    games = solver_demonstrations(train[:40], pool, noise=PLAN.sft_noise, seed=0)
    return build_model(PLAN, tmp_path_factory.mktemp("wordle") / "model", games, pool, 0), pool, validation


def test_the_guesses_are_found_in_the_calls_not_in_the_feedback(
    tiny: tuple[Path, list[str], list[str]],
) -> None:
    from transformers import AutoTokenizer

    model_dir, pool, validation = tiny
    secret = validation[0]
    words = solver_game(secret, pool, random.Random(1), noise=0.0)
    demonstration = game_demonstration(secret, words)
    text = AutoTokenizer.from_pretrained(model_dir).apply_chat_template(
        demonstration["messages"], tools=demonstration["tools"], tokenize=False
    )
    spans = guess_spans(text, words)
    assert [text[start:stop] for start, stop in spans] == words
    # Each inside its call's arguments (the template's hermes JSON), in order.
    assert all(text[start - 10 : start] == '"guess": "' for start, _ in spans)


def test_a_random_model_is_surprised_by_the_vocabulary_and_a_reader_less_each_guess(
    tiny: tuple[Path, list[str], list[str]],
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir, pool, validation = tiny
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    rows = feedback_reading(model, AutoTokenizer.from_pretrained(model_dir), pool, validation[:6])
    assert [row["guess"] for row in rows] == list(range(1, len(rows) + 1)) and rows[0]["games"] == 6
    # A random init's logits are nearly flat (within 0.2 nats of uniform here), and every pool word is
    # one token of the tiny BPE: each guess costs about log |vocabulary| nats, whatever the feedback.
    assert all(abs(row["policy_nats"] - math.log(model.config.vocab_size)) < 0.3 for row in rows)
    # The first guess has read nothing; each later one a perfect reader narrows.
    assert rows[0]["reader_nats"] == rows[0]["pool_nats"] == round(math.log(len(pool)), 3)
    readers = [row["reader_nats"] for row in rows]
    assert readers == sorted(readers, reverse=True) and readers[1] < readers[0] - 1


def test_each_surprise_is_the_models_logprob_of_the_word_after_its_prefix(
    tiny: tuple[Path, list[str], list[str]],
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir, pool, validation = tiny
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    secret = validation[1]
    words = solver_game(secret, pool, random.Random(2), noise=0.0)
    demonstration = game_demonstration(secret, words)
    text = tokenizer.apply_chat_template(
        demonstration["messages"], tools=demonstration["tools"], tokenize=False
    )
    expected = []
    for (start, _), word in zip(guess_spans(text, words), words, strict=True):
        # The prefix alone, then the word's one token: an independent pass per guess.
        prefix = tokenizer(text[:start], add_special_tokens=False)["input_ids"]
        (word_id,) = tokenizer(text[start : start + len(word)], add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([prefix])).logits[0, -1].float()
        expected.append(-torch.log_softmax(logits, dim=-1)[word_id].item())
    assert game_surprise(model, tokenizer, secret, words) == pytest.approx(expected, abs=1e-4)


def test_a_model_is_measured_as_shipped_on_a_named_plans_secrets(
    tiny: tuple[Path, list[str], list[str]], capsys: pytest.CaptureFixture
) -> None:
    # No run directory: the model without an adapter, on the secrets `--plan quick --seed 0` gives the
    # demo (those the fixture's model was built for), the same table feedback_reading computes.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir, pool, validation = tiny
    assert main(["--model", str(model_dir), "--plan", "quick", "--games", "3"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split() == ["guess", "games", "policy", "nats", "reader", "nats", "pool", "nats"]
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    rows = feedback_reading(model, AutoTokenizer.from_pretrained(model_dir), pool, validation[:3])
    assert [line.split() for line in printed[1:]] == [[str(row[key]) for key, _ in FIELDS] for row in rows]


def test_without_a_run_or_a_model_the_command_says_what_to_give(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exited:
        main([])
    assert exited.value.code == 2
    assert "give a run directory, or --model" in capsys.readouterr().err


def test_a_run_directory_gives_its_pool_secrets_and_warm_start(
    tiny: tuple[Path, list[str], list[str]], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # A run's layout: results.json (plan, seed), data/validation.jsonl, model/, sft-adapter/. A fresh
    # LoRA adapter changes no logit (its B is zero), so the run's table is the model's as shipped.
    import dataclasses
    import json

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from agents.wordle.dataset import VALIDATION_FILE, write_rows

    model_dir, _, validation = tiny
    run = tmp_path / "run"
    (run / "data").mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"plan": dataclasses.asdict(PLAN), "seed": 0}))
    write_rows(run / "data" / VALIDATION_FILE, validation)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"])).save_pretrained(run / "sft-adapter")
    assert main([str(run), "--model", str(model_dir), "--games", "2"]) == 0
    from_run = capsys.readouterr().out
    assert main(["--model", str(model_dir), "--plan", "quick", "--games", "2"]) == 0
    assert from_run == capsys.readouterr().out
