"""``rft sft``: supervised warm start of a LoRA adapter on demonstrations.

A demonstration is one chat request as the agent sends it: ``{"messages": [...], "tools": [...]}`` in
OpenAI format, ending with the assistant's last turn. It is rendered through the model's own chat
template exactly as the policy server renders a rollout (same message normalisation, same template;
``--chat-template`` replaces the model's own, as the ``chat_template`` setting does for serving),
and the loss covers only what the model itself would sample: each assistant turn's content and
tool calls up to and including its end-of-turn token. Everything else (system prompt, tool list,
user messages, tool results, the template's role headers) is context.

The adapter is saved in peft format, the same as the GRPO learner's versions, so ``rft train`` can
start from it.

    rft sft --model MODEL_DIR --maze-demos 300 --maze-noise 0.3 --out runs/sft-adapter --steps 400 \\
        --target-modules embed_tokens,q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head
    rft sft --model MODEL_DIR --data demos.jsonl --out runs/sft-adapter --steps 200
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# A model built from scratch has a random output layer whose logits are too small to ever become
# confident, so the adapter needs lm_head besides every projection (vLLM serves lm_head LoRA too).
PROJECTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DEFAULT_TARGET_MODULES = (*PROJECTION_MODULES, "lm_head")
IGNORE = -100
MAX_GRAD_NORM = 1.0


class DemonstrationError(ValueError):
    """A demonstration that cannot be rendered or has nothing to learn from."""


@dataclass
class SftResult:
    """What a warm start did."""

    adapter_dir: Path
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    assistant_tokens: int = 0
    # With a StopAtLoss: the held-out loss at every check, by step.
    held_out_losses: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class StopAtLoss:
    """End a warm start early: every ``every`` steps, the adapter's mean assistant-token loss on
    ``demonstrations`` (held out: not the ones it trains on) is measured, and the run ends at the
    first check where it is at most ``target``. A start's strength then depends on where it stands,
    not on how fast its seed happened to learn (the maze demo: README, "How the plan got here")."""

    demonstrations: Sequence[dict[str, Any]]
    target: float
    every: int = 5


@dataclass(frozen=True)
class EncodedDemonstration:
    """Token ids of one rendered demonstration and which of them the loss covers."""

    input_ids: list[int]
    loss_mask: list[bool]


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt
    )


def encode_demonstration(tokenizer: Any, demonstration: dict[str, Any]) -> EncodedDemonstration:
    """Render ``demonstration`` with the chat template and mark the assistant's own tokens.

    An assistant turn spans from the end of the generation prompt that precedes it to its end-of-turn
    token; the newline the template puts after that token is part of the next prompt, not sampled.
    """
    from policy_server.chat_format import normalize_messages

    try:
        messages = normalize_messages(list(demonstration["messages"]))
    except (KeyError, TypeError) as exc:
        raise DemonstrationError(f"a demonstration needs a 'messages' list: {exc}") from exc
    tools = demonstration.get("tools")
    text = _render(tokenizer, messages, tools, False)
    spans: list[tuple[int, int]] = []
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        start = len(_render(tokenizer, messages[:index], tools, True))
        turn = _render(tokenizer, messages[: index + 1], tools, False)
        if not text.startswith(turn):
            raise DemonstrationError(
                "the chat template does not render this conversation prefix-preservingly, so the "
                "assistant's tokens cannot be located; use a template whose turns only append"
            )
        spans.append((start, len(turn.rstrip("\n"))))
    if not spans:
        raise DemonstrationError("a demonstration needs at least one assistant message to learn from")
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [
        any(begin <= token_start and token_end <= end for begin, end in spans)
        for token_start, token_end in encoding["offset_mapping"]
    ]
    return EncodedDemonstration(list(encoding["input_ids"]), mask)


def load_demonstrations(path: str | Path) -> list[dict[str, Any]]:
    """Demonstrations from a JSONL file, one ``{"messages": [...], "tools": [...]}`` per line."""
    demonstrations = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DemonstrationError(f"{path}:{number}: not JSON: {exc}") from exc
            if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
                raise DemonstrationError(f'{path}:{number}: expected {{"messages": [...], "tools": [...]}}')
            demonstrations.append(row)
    if not demonstrations:
        raise DemonstrationError(f"{path} holds no demonstrations")
    return demonstrations


def pad_batch(examples: Sequence[EncodedDemonstration], pad_id: int) -> dict[str, torch.Tensor]:
    length = max(len(example.input_ids) for example in examples)
    input_ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), length), IGNORE, dtype=torch.long)
    attention = torch.zeros((len(examples), length), dtype=torch.long)
    for row, example in enumerate(examples):
        ids = torch.tensor(example.input_ids, dtype=torch.long)
        input_ids[row, : len(ids)] = ids
        attention[row, : len(ids)] = 1
        labels[row, : len(ids)] = torch.where(torch.tensor(example.loss_mask), ids, IGNORE)
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


def assistant_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy over the batch's assistant tokens."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    targets = batch["labels"][:, 1:]
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE
    )


@dataclass
class Trainee:
    """What a warm start needs of one kind of model: its encoded demonstrations, how to load it, how
    to batch them and the loss (text models here; vision-language ones in ``sft_vision.py``)."""

    encoded: list[Any]
    load_model: Callable[[], Any]
    batch: Callable[[list[Any]], dict[str, torch.Tensor]]
    loss: Callable[[Any, dict[str, torch.Tensor]], torch.Tensor]


def pad_token_id(config: Any) -> int:
    """The model's padding id (a vision-language model keeps it in its text config), else 0."""
    pad = getattr(config, "pad_token_id", None)
    if pad is None and hasattr(config, "get_text_config"):
        pad = getattr(config.get_text_config(), "pad_token_id", None)
    return int(pad if pad is not None else 0)


def held_out_loss(model: Any, trainee: Trainee, batch_size: int = 16) -> float:
    """Mean assistant-token loss of ``model`` on ``trainee``'s demonstrations, without gradients."""
    total, tokens = 0.0, 0
    model.eval()
    with torch.no_grad():
        for start in range(0, len(trainee.encoded), batch_size):
            batch = trainee.batch(trainee.encoded[start : start + batch_size])
            count = int((batch["labels"][:, 1:] != IGNORE).sum())
            total += float(trainee.loss(model, batch)) * count
            tokens += count
    model.train()
    return total / max(tokens, 1)


def _trainee(
    model_dir: str | Path, demonstrations: Sequence[dict[str, Any]], chat_template: str | Path | None
) -> Trainee:
    from transformers import AutoConfig, AutoModelForCausalLM

    from policy_server.chat_templates import load_tokenizer
    from policy_server.vision_inputs import is_vision_model
    from trainer.sft.vision import vision_trainee

    tokenizer = load_tokenizer(model_dir, chat_template)
    if not demonstrations:
        raise DemonstrationError("no demonstrations to train on")
    config = AutoConfig.from_pretrained(str(model_dir))
    if is_vision_model(config):
        return vision_trainee(model_dir, tokenizer, demonstrations)
    encoded = [encode_demonstration(tokenizer, demonstration) for demonstration in demonstrations]
    pad_id = pad_token_id(config)
    return Trainee(
        encoded=encoded,
        load_model=lambda: AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32),
        batch=lambda examples: pad_batch(examples, pad_id),
        loss=assistant_loss,
    )


def run_sft(
    model_dir: str | Path,
    demonstrations: Sequence[dict[str, Any]],
    out_dir: str | Path,
    *,
    steps: int = 100,
    learning_rate: float = 2e-3,
    batch_size: int = 16,
    lora_r: int = 16,
    lora_alpha: float = 32.0,
    lora_dropout: float = 0.0,
    target_modules: Sequence[str] = DEFAULT_TARGET_MODULES,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
    chat_template: str | Path | None = None,
    stop: StopAtLoss | None = None,
) -> SftResult:
    """Train a fresh LoRA adapter on ``demonstrations`` for ``steps`` AdamW steps; save it to ``out_dir``.

    Each step draws ``batch_size`` demonstrations (seeded). ``on_step(step, loss)`` is called after
    every step (progress display). ``chat_template`` replaces the model's own template (a shipped
    name or a file, see ``policy_server.chat_templates``): use the one the policy server will use.
    ``stop`` ends the run before ``steps`` once a held-out loss reaches its target.
    """
    from peft import LoraConfig, get_peft_model

    if steps < 1 or batch_size < 1:
        raise ValueError("steps and batch_size must be at least 1")
    started = time.monotonic()
    trainee = _trainee(model_dir, demonstrations, chat_template)
    held_out = None if stop is None else _trainee(model_dir, stop.demonstrations, chat_template)
    encoded = trainee.encoded
    torch.manual_seed(seed)
    base = trainee.load_model()
    model = get_peft_model(
        base,
        LoraConfig(
            r=lora_r,
            lora_alpha=lora_alpha,
            lora_dropout=lora_dropout,
            target_modules=list(target_modules),
            task_type="CAUSAL_LM",
        ),
    )
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=learning_rate)
    rng = random.Random(seed)
    result = SftResult(adapter_dir=Path(out_dir), assistant_tokens=sum(sum(e.loss_mask) for e in encoded))
    for step in range(1, steps + 1):
        loss = trainee.loss(model, trainee.batch(rng.choices(encoded, k=batch_size)))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, MAX_GRAD_NORM)
        optimizer.step()
        result.losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, result.losses[-1])
        if stop is not None and held_out is not None and step % stop.every == 0:
            result.held_out_losses[step] = held_out_loss(model, held_out)
            if result.held_out_losses[step] <= stop.target:
                break
    result.adapter_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(result.adapter_dir), save_embedding_layers=False)  # LoRA weights only
    result.seconds = time.monotonic() - started
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rft sft", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", required=True, type=Path, help="base model directory (transformers format)"
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--data", type=Path, help='JSONL of {"messages": [...], "tools": [...]} demonstrations'
    )
    source.add_argument(
        "--maze-demos", type=int, metavar="N", help="demonstrations walked on N training mazes"
    )
    parser.add_argument(
        "--maze-noise",
        type=float,
        default=0.0,
        metavar="P",
        help="with --maze-demos: the walker's chance of a random move instead of a shortest-path one "
        "(default 0: perfect demonstrations)",
    )
    parser.add_argument(
        "--maze-labels",
        choices=("walker", "shortest"),
        default="walker",
        help="with --maze-demos: each call is the walker's own move (default) or the shortest-path "
        "move from the state the walker reached (clean labels on a noisy walk)",
    )
    parser.add_argument("--out", required=True, type=Path, help="directory to write the adapter into")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps (default 100)")
    parser.add_argument("--lr", type=float, default=2e-3, help="learning rate (default 2e-3)")
    parser.add_argument("--batch-size", type=int, default=16, help="demonstrations per step (default 16)")
    parser.add_argument("--lora-r", type=int, default=16, help="LoRA rank (default 16)")
    parser.add_argument("--lora-alpha", type=float, default=32.0, help="LoRA alpha (default 32)")
    parser.add_argument("--lora-dropout", type=float, default=0.0)
    parser.add_argument(
        "--target-modules",
        default=",".join(DEFAULT_TARGET_MODULES),
        help="comma-separated module names to adapt (default: every projection; a tiny model built "
        "from scratch needs embed_tokens and lm_head too)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--chat-template",
        help="template replacing the model's own: a shipped name (chatml-tools) or a Jinja file; use "
        "the one training will serve with (the config's chat_template)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """``rft sft``: train and save a warm-start adapter; prints the loss as it goes."""
    args = _parser().parse_args(argv)
    try:
        if args.data is not None:
            demonstrations = load_demonstrations(args.data)
        else:
            from agents.maze.demonstrations import maze_demonstrations

            demonstrations = maze_demonstrations(
                args.maze_demos, noise=args.maze_noise, seed=args.seed, labels=args.maze_labels
            )
        every = max(1, args.steps // 10)

        def report(step: int, loss: float) -> None:
            if step % every == 0 or step == args.steps:
                print(f"sft step {step}/{args.steps}  loss {loss:.4f}", flush=True)

        result = run_sft(
            args.model,
            demonstrations,
            args.out,
            steps=args.steps,
            learning_rate=args.lr,
            batch_size=args.batch_size,
            lora_r=args.lora_r,
            lora_alpha=args.lora_alpha,
            lora_dropout=args.lora_dropout,
            target_modules=[name.strip() for name in args.target_modules.split(",") if name.strip()],
            seed=args.seed,
            on_step=report,
            chat_template=args.chat_template,
        )
    except (DemonstrationError, ValueError, OSError) as exc:
        print(f"rft sft: {exc}", file=sys.stderr)
        return 2
    print(f"adapter written to {result.adapter_dir} ({result.seconds:.0f} s)")
    return 0
