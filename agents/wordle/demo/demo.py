"""``rft demo --task wordle``: a policy learns the SageMaker service's own task, Wordle, end to end.

1. draws the secrets (seeded): a pool of the answer list, 128 held-out validation secrets and the
   training ones, disjoint (``agents/wordle/dataset.py``);
2. builds the model (a tiny Llama offline, its tokenizer trained over solver games and the pool's
   words; or ``--model``, e.g. ``smollm2``) and warm-starts a LoRA adapter (``rft sft``) on games a
   noisy solver plays on training secrets (``agents/wordle/demo/solver.py``);
3. serves the real Strands Wordle agent (``agents/wordle/main.py``, its ``BedrockAgentCoreApp`` on
   uvicorn in its own process) and runs ``rft train`` against it over loopback HTTP: the policy
   server (``hf``, or ``vllm`` with each adapter version hot-loaded), evaluation on the validation
   secrets, GRPO on the agent's own reward, evaluation again on the same secrets with the same seeds;
4. reports the run as the service does (``agents/wordle/demo/report.py``) on the console and in
   ``results.json``, with the final adapter and ``train.yaml`` to rerun the GRPO stage.

    rft demo --task wordle                              # the tiny model
    rft demo --task wordle --quick                      # the suite's run, a few minutes
    rft demo --task wordle --model smollm2 --engine vllm   # make demo-wordle
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.maze.demo.agent_process import serve_agent
from agents.maze.demo.grpo_config import grpo_fields, write_rerun_config
from agents.maze.demo.model import banner
from agents.maze.demo.plans import PRETRAINED_TARGET_MODULES, SMOLLM2_CHAT_TEMPLATE, TINY_TARGET_MODULES
from agents.wordle.demo.model import build_model, secret_split, sft_games, warm_start
from agents.wordle.demo.plans import FULL, QUICK, SMOLLM2, SMOLLM2_QUICK, WordlePlan, plan_name
from agents.wordle.demo.report import GameStats, billing, report_table, rollouts_processed
from trainer.config import TokenPrices, TrainConfig

if TYPE_CHECKING:
    from trainer import RunSummary
    from trainer.sft import SftResult

AGENT_MODULE = "agents.wordle.main"
# Wins score above 1.05, losses at most -0.25 (agents/wordle/reward.py): success is a win.
WIN_THRESHOLD = 1.0


def train_config(
    plan: WordlePlan,
    *,
    model_dir: Path,
    init_adapter: Path,
    data_dir: Path,
    output_dir: Path,
    agent_url: str,
    engine: str,
    target_modules: list[str],
    seed: int,
    chat_template: str | None,
    prices: TokenPrices,
) -> TrainConfig:
    """The GRPO run of the demo, as a ``rft train`` config."""
    from agents.wordle.dataset import TRAIN_FILE, VALIDATION_FILE
    from agents.wordle.game import MAX_TOOL_CALLS

    fields = grpo_fields(
        plan,
        model_dir=model_dir,
        init_adapter=init_adapter,
        train_file=data_dir / TRAIN_FILE,
        eval_file=data_dir / VALIDATION_FILE,
        output_dir=output_dir,
        agent_url=agent_url,
        engine=engine,
        target_modules=target_modules,
        seed=seed,
        chat_template=chat_template,
    )
    fields.update(
        # The service evaluates at the effort used in training: sampled as GRPO samples.
        temperature=plan.temperature,
        eval_temperature=plan.temperature,
        success_threshold=WIN_THRESHOLD,
        max_completion_length=48,
        # The game ends itself at MAX_TOOL_CALLS calls; one more is the agent's last word.
        max_calls_per_rollout=MAX_TOOL_CALLS + 1,
        prices=prices.model_dump(),
    )
    return TrainConfig.model_validate(fields)


def run_wordle_demo(
    run_dir: Path,
    plan: WordlePlan,
    *,
    engine: str = "hf",
    model: Path | None = None,
    seed: int = 0,
    chat_template: str | None = None,
    prices: TokenPrices | None = None,
) -> dict[str, Any]:
    """Run every stage into ``run_dir``; returns the results written to ``run_dir/results.json``.
    ``model`` None builds the tiny model; ``prices``: the config's token prices (the service's list
    prices are reported beside them)."""
    from agents.wordle.dataset import TRAIN_FILE, VALIDATION_FILE, write_rows

    started = time.monotonic()
    run_dir.mkdir(parents=True, exist_ok=True)
    banner(f"1/4 secrets and model (Wordle {plan_name(plan)} demo, run directory {run_dir})")
    pool, train_secrets, validation = secret_split(plan, seed)
    data_dir = run_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    write_rows(data_dir / TRAIN_FILE, train_secrets)
    write_rows(data_dir / VALIDATION_FILE, validation)
    print(f"{len(train_secrets)} training and {len(validation)} validation secrets, from {len(pool)} words")
    games = sft_games(plan, pool, train_secrets, seed)
    if model is None:
        model_dir, target_modules = (
            build_model(plan, run_dir / "model", games, pool, seed),
            TINY_TARGET_MODULES,
        )
    else:
        model_dir, target_modules = model, PRETRAINED_TARGET_MODULES
    sft = warm_start(plan, model_dir, target_modules, games, run_dir / "sft-adapter", seed, chat_template)
    banner("3/4 the Wordle agent on uvicorn, policy server and trainer over loopback HTTP")
    stats = GameStats()
    with serve_agent(AGENT_MODULE) as agent_url:
        print(f"Wordle agent listening at {agent_url}")
        config = train_config(
            plan,
            model_dir=model_dir,
            init_adapter=sft.adapter_dir,
            data_dir=data_dir,
            output_dir=run_dir / "grpo",
            agent_url=agent_url,
            engine=engine,
            target_modules=target_modules,
            seed=seed,
            chat_template=chat_template,
            prices=prices or TokenPrices(),
        )
        write_rerun_config(config, run_dir / "train.yaml", demo="Wordle demo", agent_module=AGENT_MODULE)
        print(
            f"evaluate on {plan.eval_rows} held-out secrets, GRPO for {plan.grpo_steps} steps "
            f"({plan.rows_per_step} secrets x {plan.num_generations} games), evaluate again",
            flush=True,
        )
        from trainer import train

        summary = train(config, on_evaluation=stats)
    return _results(run_dir, plan, config, summary, stats, sft, started)


def _results(
    run_dir: Path,
    plan: WordlePlan,
    config: TrainConfig,
    summary: RunSummary,
    stats: GameStats,
    sft: SftResult,
    started: float,
) -> dict[str, Any]:
    """Stage 4: the report, the final adapter and ``results.json``."""
    banner("4/4 results")
    evaluations = summary.evaluations
    before = {**stats.by_step[evaluations[0]["step"]], "mean_reward": evaluations[0]["mean_reward"]}
    after = {**stats.by_step[evaluations[-1]["step"]], "mean_reward": evaluations[-1]["mean_reward"]}
    lift = 100 * (after["win_rate"] - before["win_rate"])
    cost = summary.cost
    tokens = {"prefill": cost.prefill_tokens, "sample": cost.sample_tokens, "train": cost.train_tokens}
    if summary.adapter_dir is not None:
        shutil.rmtree(run_dir / "adapter", ignore_errors=True)
        shutil.copytree(summary.adapter_dir, run_dir / "adapter")
    results = {
        "before": before,
        "after": after,
        "lift_points": lift,
        "rollouts": rollouts_processed(summary.history, evaluations),
        "billing": billing(tokens, config.prices, lift),
        "evaluations": evaluations,
        "sft_losses": sft.losses,
        "plan": plan.__dict__,
        "engine": config.engine,
        "seed": config.seed,
        "seconds": time.monotonic() - started,
    }
    print(report_table(results))
    (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nrun directory {run_dir}: results.json, adapter/, train.yaml, grpo/ (metrics, MLflow store)")
    return results


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rft demo --task wordle", description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=("wordle",), default="wordle", help="the demo's task")
    parser.add_argument(
        "--quick", action="store_true", help="a smaller run (a few minutes on the tiny model)"
    )
    parser.add_argument("--out", type=Path, help="run directory (default: runs/wordle-<time>)")
    parser.add_argument(
        "--engine", choices=("hf", "vllm"), default="hf", help="inference engine (default hf)"
    )
    parser.add_argument(
        "--model",
        help="base model directory, or 'smollm2' for SmolLM2-135M-Instruct (`rft model smollm2`, cached; its "
        "own plan and the chatml-tools template); default: a tiny model built offline",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of secrets, model, data order and sampling")
    parser.add_argument(
        "--prices",
        metavar="PREFILL,SAMPLE,TRAIN",
        help="dollars per million tokens to report besides the service's list prices (default: those)",
    )
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    return parser


def _prices(text: str | None, parser: argparse.ArgumentParser) -> TokenPrices:
    if text is None:
        return TokenPrices()
    try:
        prefill, sample, train = (float(part) for part in text.split(","))
    except ValueError:
        parser.error(f"--prices takes three numbers, PREFILL,SAMPLE,TRAIN dollars per million; got {text!r}")
    return TokenPrices(prefill=prefill, sample=sample, train=train)


def main(argv: list[str] | None = None) -> int:
    """``rft demo --task wordle``: see the module docstring."""
    import sys
    import warnings
    from datetime import datetime

    from trainer.ops import pin_cpu_kernels

    parser = _parser()
    args = parser.parse_args(argv)
    prices = _prices(args.prices, parser)
    pin_cpu_kernels()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.engine == "vllm" and args.model is None:
        parser.error("--engine vllm needs --model DIR or smollm2 (a model vLLM can serve with LoRA)")
    warnings.filterwarnings(
        "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
    )
    run_dir = args.out or Path("runs") / f"wordle-{datetime.now():%Y%m%d-%H%M%S}"
    if (run_dir / "grpo").exists():
        print(f"rft demo: {run_dir} already holds a demo run; choose another --out", file=sys.stderr)
        return 2
    model, chat_template = (Path(args.model) if args.model else None), None
    # A pretrained model plays the service's shape: secrets from the whole answer list.
    if model is None:
        plan = QUICK if args.quick else FULL
    else:
        plan = SMOLLM2_QUICK if args.quick else SMOLLM2
    if args.model == "smollm2":
        from policy_server.models import ModelBuildError, cached_smollm2

        try:
            model = cached_smollm2()
        except ModelBuildError as exc:
            print(f"rft demo: {exc}", file=sys.stderr)
            return 2
        chat_template = SMOLLM2_CHAT_TEMPLATE
    run_wordle_demo(
        run_dir,
        plan,
        engine=args.engine,
        model=model,
        seed=args.seed,
        chat_template=chat_template,
        prices=prices,
    )
    return 0
