"""The Wordle demo's policy before GRPO: the secrets, the solver's games, the tiny model built offline
(its tokenizer trained over those games and the pool's words) and the supervised warm start."""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.maze.demo.model import banner
from agents.wordle.demo.plans import WordlePlan
from agents.wordle.demo.solver import solver_demonstrations

if TYPE_CHECKING:
    from trainer.sft import SftResult


def secret_split(plan: WordlePlan, seed: int) -> tuple[list[str], list[str], list[str]]:
    """The pool the secrets come from, the training secrets and the validation secrets (disjoint)."""
    from agents.wordle.dataset import split_secrets
    from agents.wordle.word_lists import answers

    words = list(answers())
    pool = (
        sorted(random.Random(f"wordle-pool-{seed}").sample(words, plan.secret_pool))
        if plan.secret_pool
        else words
    )
    train, validation = split_secrets(seed, plan.train_secrets, plan.eval_rows, pool=pool)
    return pool, train, validation


def sft_games(plan: WordlePlan, pool: list[str], train: list[str], seed: int) -> list[dict[str, Any]]:
    """The warm start's demonstrations: the noisy solver on the training secrets, in turn."""
    secrets = [train[index % len(train)] for index in range(plan.sft_games)]
    return solver_demonstrations(
        secrets, pool, noise=plan.sft_noise, seed=seed, end_before_win=plan.sft_end_before_win
    )


def build_model(
    plan: WordlePlan, out_dir: Path, games: list[dict[str, Any]], pool: list[str], seed: int
) -> Path:
    """The tiny Llama, its BPE trained over rendered solver games and the pool's words (each several
    times, lower and upper case, so a guess is a token or two)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from policy_server.http import normalize_messages
    from policy_server.models import TINY_CHAT_TEMPLATE, TINY_HEAD_DIM, build_tiny_model

    corpus = []
    for game in games[:300]:
        rendered, _ = render_jinja_template(
            conversations=[normalize_messages(game["messages"])],
            tools=game["tools"],
            chat_template=TINY_CHAT_TEMPLATE,
        )
        corpus.extend(rendered)
    corpus.extend(f'{{"guess": "{word}"}} {word.upper()} ->' for word in pool for _ in range(2))
    model_dir = build_tiny_model(
        out_dir,
        seed=seed,
        corpus=corpus,
        vocab_size=plan.vocab_size,
        hidden_size=plan.hidden_size,
        num_layers=plan.num_layers,
        num_heads=plan.hidden_size // TINY_HEAD_DIM,
        intermediate_size=2 * plan.hidden_size,
    )
    print(f"tiny Llama (hidden {plan.hidden_size}, {plan.num_layers} layers) built in {model_dir}")
    return model_dir


def warm_start(
    plan: WordlePlan,
    model_dir: Path,
    target_modules: list[str],
    games: list[dict[str, Any]],
    out_dir: Path,
    seed: int,
    chat_template: str | None,
) -> SftResult:
    """``rft sft`` on the noisy solver's games."""
    from trainer.sft import run_sft

    banner(
        f"2/4 supervised warm start: {plan.sft_steps} steps on {len(games)} games of a noisy solver "
        f"(noise {plan.sft_noise})"
    )
    every = max(1, plan.sft_steps // 10)

    def report(step: int, loss: float) -> None:
        if step % every == 0 or step == plan.sft_steps:
            print(f"sft step {step}/{plan.sft_steps}  loss {loss:.4f}", flush=True)

    sft = run_sft(
        model_dir,
        games,
        out_dir,
        steps=plan.sft_steps,
        learning_rate=plan.sft_learning_rate,
        batch_size=plan.sft_batch_size,
        lora_r=plan.lora_r,
        lora_alpha=plan.lora_alpha,
        target_modules=target_modules,
        seed=seed,
        on_step=report,
        chat_template=chat_template,
    )
    print(f"warm-start adapter written to {sft.adapter_dir} ({sft.seconds:.0f} s)")
    return sft
