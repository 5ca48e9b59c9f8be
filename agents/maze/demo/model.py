"""The demo's policy before GRPO: the tiny model built offline (its tokenizer trained on maze
conversations) and the supervised warm start of its adapter on a walker's demonstrations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.maze.demo.plans import TINY_TARGET_MODULES, VISION_TOWER_MODULES, DemoPlan
from trainer.sft import SftResult, StopAtLoss, run_sft

# The warm start's stopping check walks these many mazes, from a seed no training maze reaches.
SFT_HELD_OUT_MAZES = 20
SFT_HELD_OUT_FIRST_SEED = 500_000


def banner(text: str) -> None:
    """A stage heading, so progress is visible in a plain terminal log."""
    print(f"\n=== {text} ===", flush=True)


def maze_corpus(count: int, observation: str = "text") -> list[str]:
    """Maze conversations rendered with the tiny model's template (the tiny VLM's for ``image``), for
    its tokenizer to train on."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from agents.maze.demonstrations import maze_demonstrations
    from policy_server.http import normalize_messages
    from policy_server.models import TINY_CHAT_TEMPLATE, TINY_VISION_CHAT_TEMPLATE

    texts = []
    for demonstration in maze_demonstrations(count, observation=observation):  # type: ignore[arg-type]
        rendered, _ = render_jinja_template(
            conversations=[normalize_messages(demonstration["messages"])],
            tools=demonstration["tools"],
            chat_template=TINY_VISION_CHAT_TEMPLATE if observation == "image" else TINY_CHAT_TEMPLATE,
        )
        texts.extend(rendered)
    return texts


def build_demo_model(plan: DemoPlan, out_dir: Path, seed: int) -> tuple[Path, list[str]]:
    """The tiny model the plan asks for, built offline (a VLM for image observations), and the
    modules its adapter covers."""
    from policy_server.models import TINY_HEAD_DIM, MRope, build_tiny_model, build_tiny_vision_model

    corpus = maze_corpus(300, plan.observation)
    if plan.observation == "image":
        model_dir = build_tiny_vision_model(
            out_dir,
            seed=seed,
            corpus=corpus,
            hidden_size=plan.hidden_size,
            num_layers=plan.num_layers,
            rope=MRope(plan.vision_rope_theta, plan.vision_mrope),
        )
        print(f"tiny Qwen2-VL (hidden {plan.hidden_size}, {plan.num_layers} layers) built in {model_dir}")
        return model_dir, [*TINY_TARGET_MODULES, *VISION_TOWER_MODULES]
    model_dir = build_tiny_model(
        out_dir,
        seed=seed,
        corpus=corpus,
        hidden_size=plan.hidden_size,
        num_layers=plan.num_layers,
        num_heads=plan.hidden_size // TINY_HEAD_DIM,
        intermediate_size=2 * plan.hidden_size,
    )
    print(f"tiny Llama (hidden {plan.hidden_size}, {plan.num_layers} layers) built in {model_dir}")
    return model_dir, TINY_TARGET_MODULES


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
