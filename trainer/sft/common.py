"""What every warm start shares, text or vision: the demonstrations, batching, the assistant-token
loss, and what a run returns.

A demonstration is one chat request as the agent sends it: ``{"messages": [...], "tools": [...]}`` in
OpenAI format, ending with the assistant's last turn. It is encoded into training sequences turn by
turn, as sampling makes them (``trainer.sft.turns``); the loss covers only what the model itself
would sample: each assistant turn's content and tool calls up to and including its end-of-turn token.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.algo.grpo import token_logprobs
from trainer.algo.sequences import right_pad
from trainer.sft.turns import DemonstrationError, EncodedDemonstration

# A model built from scratch has a random output layer whose logits are too small to ever become
# confident, so the adapter needs lm_head besides every projection (vLLM serves lm_head LoRA too).
PROJECTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DEFAULT_TARGET_MODULES = (*PROJECTION_MODULES, "lm_head")
IGNORE = -100
MAX_GRAD_NORM = 1.0


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


class DemonstrationFile(list[dict[str, Any]]):
    """Demonstrations read from a file, with where each one is (``path:line``) for the messages of
    the ones that cannot be encoded."""

    def __init__(self, rows: list[dict[str, Any]], origins: list[str]) -> None:
        super().__init__(rows)
        self.origins = origins


def load_demonstrations(path: str | Path) -> DemonstrationFile:
    """Demonstrations from a JSONL file, one ``{"messages": [...], "tools": [...]}`` per line."""
    rows: list[dict[str, Any]] = []
    origins: list[str] = []
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
            rows.append(row)
            origins.append(f"{path}:{number}")
    if not rows:
        raise DemonstrationError(f"{path} holds no demonstrations")
    return DemonstrationFile(rows, origins)


def encode_each(
    demonstrations: Sequence[dict[str, Any]], encode: Callable[[dict[str, Any]], list[Any]]
) -> list[list[Any]]:
    """Every demonstration's training sequences; one that cannot be encoded stops it all, named by
    its file and line (``demonstration N`` where they came from no file)."""
    encoded = []
    for index, demonstration in enumerate(demonstrations):
        try:
            encoded.append(encode(demonstration))
        except DemonstrationError as error:
            origin = (
                demonstrations.origins[index]
                if isinstance(demonstrations, DemonstrationFile)
                else f"demonstration {index + 1}"
            )
            raise DemonstrationError(f"{origin}: {error}") from error
    return encoded


def demonstration_batch(examples: Sequence[EncodedDemonstration], pad_id: int) -> dict[str, torch.Tensor]:
    """Encoded demonstrations right-padded into one batch; labels are the ids the loss covers, else IGNORE."""
    input_ids = right_pad([example.input_ids for example in examples], pad_id, torch.long)
    attention = right_pad([[1] * len(example.input_ids) for example in examples], 0, torch.long)
    labels = right_pad([_labels(example) for example in examples], IGNORE, torch.long)
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


def _labels(example: EncodedDemonstration) -> torch.Tensor:
    """The ids the loss covers, IGNORE elsewhere."""
    ids = torch.tensor(example.input_ids, dtype=torch.long)
    return torch.where(torch.tensor(example.loss_mask), ids, IGNORE)


def text_logits(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """A text model's logits for a demonstration batch."""
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def assistant_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the assistant tokens (``labels`` other than IGNORE)."""
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=IGNORE
    )


def turn_logprobs(
    logits: torch.Tensor, batch: dict[str, torch.Tensor], temperature: float = 1.0
) -> torch.Tensor:
    """Each row's log-probability of its assistant tokens, sampled at ``temperature`` (float64: a poor
    policy's turn can be less likely than float32's smallest number)."""
    taken = token_logprobs(logits / temperature, batch["input_ids"])[:, 1:]
    assistant = (batch["labels"][:, 1:] != IGNORE).double()
    return (taken.double() * assistant).sum(-1)


@dataclass
class Trainee:
    """What a warm start needs of one kind of model: its encoded demonstrations, how to load it, how
    to batch them and the loss (text models: ``trainer.sft.text``; vision-language ones:
    ``trainer.sft.vision``)."""

    encoded: list[list[Any]]  # each demonstration's training sequences
    load_model: Callable[[torch.dtype], Any]  # the base model, loaded in this dtype
    batch: Callable[[list[Any]], dict[str, torch.Tensor]]
    forward: Callable[[Any, dict[str, torch.Tensor]], torch.Tensor]  # the model's logits for a batch

    def loss(self, model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean next-token cross-entropy over the batch's assistant tokens."""
        return assistant_loss(self.forward(model, batch), batch["labels"])


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
        sequences = [sequence for sequences in trainee.encoded for sequence in sequences]
        for start in range(0, len(sequences), batch_size):
            batch = trainee.batch(sequences[start : start + batch_size])
            count = int((batch["labels"][:, 1:] != IGNORE).sum())
            total += float(trainee.loss(model, batch)) * count
            tokens += count
    model.train()
    return total / max(tokens, 1)


def sft_device_and_dtype(device: str = "auto", dtype: str = "auto") -> tuple[torch.device, torch.dtype]:
    """The warm start's device and base dtype, resolved as the learner's ``auto``: the first CUDA
    device when torch sees one (``cuda`` means ``cuda:0``), else the CPU; bfloat16 on CUDA, float32
    on the CPU."""
    if device == "auto":
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    elif device == "cuda":
        device = "cuda:0"
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return torch.device(device), getattr(torch, dtype)


def on_device(trainee: Trainee, device: torch.device) -> Trainee:
    """``trainee`` with its batches made on ``device`` (the same trainee on the CPU)."""
    if device.type == "cpu":
        return trainee
    make = trainee.batch

    def batch(examples: list[Any]) -> dict[str, torch.Tensor]:
        return {name: value.to(device) for name, value in make(examples).items()}

    return dataclasses.replace(trainee, batch=batch)
