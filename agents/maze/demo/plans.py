"""The sizes of the demo's runs (:class:`DemoPlan`): full, quick, SmolLM2, vision, and the modules
each kind of model adapts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from trainer.sft import PROJECTION_MODULES


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
    # Tokens of one forward/backward pass: SmolLM2's 49k-token vocabulary makes each token's logits
    # and activations large, and 8192 at once outgrows a 24 GB machine.
    max_tokens_per_microbatch: int = 8192
    # What the maze agent shows the policy: "text" or "image" (then the model is a tiny VLM).
    observation: str = "text"
    # The tiny VLM's M-RoPE (policy_server.models.MRope): base and the rotary frequencies of time,
    # height and width. Qwen2-VL's shape (1e4; 16, 8, 8) gives the rows and columns of an image the
    # slowest frequencies, which barely turn across a 6x6 map: the language model could not tell
    # where a cell's token lies, and the warm start never learned to read the picture.
    vision_rope_theta: float = 10000.0
    vision_mrope: tuple[int, int, int] = (16, 8, 8)
    # What GRPO trains of the warm start's vision layers (lora.adapt_vision): "none" keeps the
    # tower's and the projector's adapter as the warm start left them.
    adapt_vision: str = "none"


# `rft demo --ray`: a local cluster in the trainer's process, two inference replicas behind the one
# gateway and two data-parallel learner workers.
RAY_SECTION = {"address": "local", "inference_replicas": 2, "learner_workers": 2}

# The walker's random moves as labels stall a warm start; its noisy walk labelled with shortest-path
# moves learns the walking in a jump, at a different step for each seed. So the warm start stops at a
# held-out loss instead of after a fixed number of steps (README, "What make demo shows", has the
# measurements behind these sizes).
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
# Walker labels and half the old full plan's fixed warm-start steps: the loss is at its plateau by
# then, and the weaker start leaves GRPO more to do.
QUICK = DemoPlan(train_mazes=400, sft_demos=200, sft_steps=150, grpo_steps=16, rows_per_step=4, eval_rows=32)
# `--model smollm2`: SmolLM2-135M-Instruct learns the maze, sampled by vLLM (or hf) with each new
# adapter hot-loaded. Sized to run within an hour on two CPU cores (docs/smollm2.md has the run and
# where its time goes): a warm start on the noisy walker that teaches the call format and walks
# poorly, few rollouts a step, one optimizer pass each, no KL reference to score, LoRA on the
# projections only; the 64 fixed mazes once each before and after.
SMOLLM2 = DemoPlan(
    train_mazes=400,
    sft_demos=192,
    sft_steps=48,
    sft_batch_size=4,
    grpo_steps=20,
    rows_per_step=8,
    eval_rows=64,
    num_generations=4,
    learning_rate=5e-4,
    num_iterations=1,
    warmup_steps=0,
    beta=0.0,
    eval_generations=1,
    max_tokens_per_microbatch=2048,
)
# `--model smollm2 --quick`: the same path smoke-sized (the suite's): it proves the stages run end to
# end with a real pretrained model, not that it learns.
SMOLLM2_QUICK = DemoPlan(
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
    max_tokens_per_microbatch=2048,
)
# `--vision`: the same recipe on pictures of the map. The tiny VLM is random everywhere, its vision
# tower too, so the warm start is what teaches it to read the picture at all: clean (shortest-path)
# labels, a smaller learning rate than the text's (2e-3 learned and then lost the map), a fixed
# number of steps, and an M-RoPE whose height and width turn fast enough to place a cell's token.
# GRPO then trains the language model's part of that adapter and keeps the tower's as the warm start
# left it (lora.adapt_vision "none", the default): higher after GRPO than with the tower trained
# too. Its loss averages each episode's tokens first (loss_type "grpo"): failed episodes walk more
# calls than solved ones, and the token mean let them push the shared call format down until it
# broke on seed 1 (docs/demo.md, the visual maze, has the measurements behind these choices).
VISION = dataclasses.replace(
    FULL,
    observation="image",
    sft_target_loss=None,
    sft_steps=1000,
    sft_learning_rate=1e-3,
    grpo_steps=30,
    loss_type="grpo",
    vision_rope_theta=10.0,
    vision_mrope=(2, 15, 15),
)
# The suite's run (`rft demo --vision --quick`), sized to show learning in a few minutes: the full
# plan's recipe on 400 mazes, a 500-step warm start (it begins to read the map, and leaves GRPO
# room), then 12 GRPO steps of 6 mazes x 8 on 32 evaluation mazes, one optimizer step a batch with
# the KL reference kept: what breaks a quick run is the call format (stopped early rising), and of
# the plans tried from this warm start only this one held it well enough to lift +10 (docs/demo.md,
# the quick run, has them).
VISION_QUICK = dataclasses.replace(
    VISION,
    train_mazes=400,
    sft_demos=200,
    sft_steps=500,
    grpo_steps=12,
    rows_per_step=6,
    eval_rows=32,
    warmup_steps=4,
    num_iterations=1,
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


def plan_name(plan: DemoPlan) -> str:
    """How the banner names a plan."""
    named = (
        ("full", FULL),
        ("quick", QUICK),
        ("smollm2", SMOLLM2),
        ("smollm2 quick", SMOLLM2_QUICK),
        ("vision", VISION),
        ("vision quick", VISION_QUICK),
    )
    return next((name for name, known in named if known == plan), "custom")
