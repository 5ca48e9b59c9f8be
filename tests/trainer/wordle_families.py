"""A family's tiny model playing the real Wordle agent: built over the Wordle words, warm-started on
a noisy solver's opening calls rendered through the family's own template, then trained by ``rft
train``'s loop for a few GRPO steps (test_family_matrix.py, the matrix in docs/models.md)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from agents.maze.demo.plans import TINY_TARGET_MODULES
from agents.wordle.dataset import TRAIN_FILE, VALIDATION_FILE, write_rows
from agents.wordle.demo.demo import train_config
from agents.wordle.demo.model import secret_split, warm_start
from agents.wordle.demo.plans import WordlePlan
from agents.wordle.demo.solver import game_demonstration, solver_game
from agents.wordle.main import SYSTEM_PROMPT
from policy_server.models.families import TinySizes, family
from tests.trainer.family_matrix_rows import measured
from trainer.config import TokenPrices, TrainConfig

# Two secrets x four games a step; the warm start's few opening calls teach the call format only
# (240 steps at 5e-3 left each family's opening call well formed in 15-16 of 16 samples at
# temperature 0.7; 80 at 1e-2 left 1-9 of 16, and 240 at 1e-2 diverged on llama; 160 at 5e-3 plays
# as 240 did, 120 broke qwen3_5's calls: docs/models.md). GRPO's steps are small beside it, so one
# update does not break the format it learned.
PLAN = WordlePlan(
    secret_pool=48,
    train_secrets=8,
    sft_games=16,
    sft_steps=160,
    sft_batch_size=2,
    sft_learning_rate=5e-3,
    grpo_steps=2,
    rows_per_step=2,
    eval_rows=2,
    num_generations=4,
    lora_r=16,
    lora_alpha=32.0,
    learning_rate=1e-3,
    warmup_steps=0,
    hidden_size=64,
    vocab_size=1024,
)
# Calls a demonstration holds: the opening call, where every game starts (a template that re-renders
# history, as qwen3's drops earlier think blocks, cannot train later calls in one sequence).
DEMONSTRATION_CALLS = 1
# A game stops after this many calls (the next one answers 4xx and ends the rollout): enough turns
# for the prefix merge to show, few enough to stay cheap.
MAX_CALLS = 3
# qwen3's call with its empty think block takes about 40 of the tiny BPE's tokens.
MAX_COMPLETION_TOKENS = 64


def opening_games(pool: list[str], secrets: list[str], seed: int) -> list[dict[str, Any]]:
    """The solver's first calls on each secret, as ``rft sft`` demonstrations."""
    rng = random.Random(f"family-matrix-{seed}")
    games = [secrets[index % len(secrets)] for index in range(PLAN.sft_games)]
    return [
        game_demonstration(secret, solver_game(secret, pool, rng, PLAN.sft_noise)[:DEMONSTRATION_CALLS])
        for secret in games
    ]


def build_family_model(name: str, out: Path, pool: list[str], games: list[dict[str, Any]], seed: int) -> Path:
    """The family's tiny model; its BPE also learns the agent's prompt, tool and words."""
    corpus = [SYSTEM_PROMPT] * 4 + [json.dumps(games[0]["tools"])] * 4
    corpus += [f'{{"guess": "{word}"}} {word.upper()} ->' for word in pool for _ in range(2)]
    sizes = TinySizes(vocab_size=PLAN.vocab_size, hidden_size=PLAN.hidden_size, num_layers=PLAN.num_layers)
    return family(name).build_tiny(out, seed=seed, corpus=corpus, sizes=sizes)


def prepare(name: str, run_dir: Path, seed: int) -> tuple[Path, Path, Path]:
    """Secrets written as the Wordle demo writes them, the tiny model, its warm-start adapter."""
    pool, train_secrets, validation = secret_split(PLAN, seed)
    data_dir = run_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    write_rows(data_dir / TRAIN_FILE, train_secrets)
    write_rows(data_dir / VALIDATION_FILE, validation)
    games = opening_games(pool, train_secrets, seed)
    model_dir = build_family_model(name, run_dir / "model", pool, games, seed)
    sft = warm_start(PLAN, model_dir, TINY_TARGET_MODULES, games, run_dir / "sft", seed, None)
    return model_dir, sft.adapter_dir, data_dir


def grpo_config(
    model_dir: Path, adapter: Path, data_dir: Path, out: Path, agent_url: str, seed: int, **fields: Any
) -> TrainConfig:
    """The Wordle demo's GRPO config at the matrix's sizes, no evaluation; ``fields`` override."""
    config = train_config(
        PLAN,
        model_dir=model_dir,
        init_adapter=adapter,
        data_dir=data_dir,
        output_dir=out,
        agent_url=agent_url,
        engine="hf",
        target_modules=TINY_TARGET_MODULES,
        seed=seed,
        chat_template=None,
        prices=TokenPrices(),
    )
    return measured(
        config,
        max_completion_length=MAX_COMPLETION_TOKENS,
        max_calls_per_rollout=MAX_CALLS,
        rollout_timeout_s=300.0,
        # Below the demo's 1.0: the short warm start leaves the call format likely, not certain.
        temperature=0.7,
        **fields,
    )
