"""The sizes of the Wordle demo's runs (:class:`WordlePlan`): the tiny model's full and quick runs
and SmolLM2's."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WordlePlan:
    """The sizes of one Wordle demo run: the secrets, the model, the warm start, GRPO, the evaluation."""

    # The words the secrets are drawn from: this many of the answer list (seeded), or all of it (None).
    # The solver of the warm start guesses within the same pool, as any solver knows the answer list.
    secret_pool: int | None
    train_secrets: int
    sft_games: int  # solver games the warm start learns from, on training secrets only
    sft_steps: int
    grpo_steps: int
    rows_per_step: int  # secrets per GRPO step
    # The service's shape: 128 held-out secrets, disjoint from the training ones, the same before and
    # after GRPO, sampled with the same seeds.
    eval_rows: int = 128
    # The solver's chance of guessing any word of the pool instead of one consistent with the
    # feedback (agents/wordle/demo/solver.py): an imperfect teacher leaves GRPO something to improve.
    sft_noise: float = 0.3
    # End each won demonstration before its winning guess, so that none names its secret: games that
    # end on the training secrets teach a prior over those words (docs/wordle.md).
    sft_end_before_win: bool = False
    sft_learning_rate: float = 2e-3
    sft_batch_size: int = 8
    lora_r: int = 16
    lora_alpha: float = 32.0
    num_generations: int = 8
    learning_rate: float = 5e-4
    warmup_steps: int = 4
    num_iterations: int = 1
    loss_type: str = "dapo"
    beta: float = 0.04
    eval_generations: int = 1
    # Sampling temperature of training and of both evaluations alike (the service evaluates at the
    # effort used in training).
    temperature: float = 1.0
    # The tiny model's sizes and its tokenizer's vocabulary (trained over the games and the pool's
    # words, so a guess is a token or two); a pretrained --model ignores them.
    hidden_size: int = 128
    num_layers: int = 2
    vocab_size: int = 2048
    max_tokens_per_microbatch: int = 8192


# `rft demo --task wordle`: the tiny model on 512 secrets of the answer list (the whole list is out of
# a tiny model's reach; docs/wordle.md).
# At temperature 1 the tiny model broke its tool call's JSON in about half its games (each ends the
# game); at 0.7 it holds (docs/wordle.md). Not yet measured at this size.
FULL = WordlePlan(
    secret_pool=512,
    train_secrets=384,
    sft_games=1536,
    sft_steps=400,
    grpo_steps=30,
    rows_per_step=8,
    temperature=0.7,
)
# `rft demo --task wordle --quick`: 0.0% -> 3.1% on seed 0, short of the +10 asked (docs/wordle.md).
QUICK = WordlePlan(
    secret_pool=192,
    train_secrets=64,
    sft_games=768,
    sft_steps=150,
    grpo_steps=8,
    rows_per_step=8,
    num_generations=6,
    temperature=0.7,
)
# `--model smollm2` (make demo-wordle): SmolLM2-135M-Instruct, the service's data shape (640 training
# and 128 validation secrets drawn from the whole answer list), sampled by vLLM; LoRA on the
# projections, one optimizer pass a batch, no KL reference to score.
SMOLLM2 = WordlePlan(
    secret_pool=None,
    train_secrets=640,
    sft_games=640,
    sft_steps=80,
    sft_batch_size=4,
    sft_learning_rate=5e-4,
    grpo_steps=20,
    rows_per_step=8,
    num_generations=4,
    learning_rate=2e-4,
    warmup_steps=0,
    beta=0.0,
    max_tokens_per_microbatch=2048,
)
# `--model smollm2 --quick`: the same path smoke-sized: the stages run with a real pretrained model.
SMOLLM2_QUICK = WordlePlan(
    secret_pool=None,
    train_secrets=640,
    sft_games=8,
    sft_steps=4,
    sft_batch_size=2,
    grpo_steps=2,
    rows_per_step=1,
    eval_rows=8,
    num_generations=4,
    warmup_steps=0,
    beta=0.0,
    max_tokens_per_microbatch=2048,
)


# The plans by name: the banner's, and `agents.wordle.demo.feedback --plan`'s (spaces as hyphens).
NAMED_PLANS = {"full": FULL, "quick": QUICK, "smollm2": SMOLLM2, "smollm2 quick": SMOLLM2_QUICK}


def plan_name(plan: WordlePlan) -> str:
    """How the banner names a plan."""
    return next((name for name, known in NAMED_PLANS.items() if known == plan), "custom")
