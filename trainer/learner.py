"""The trainer-side model: a transformers causal LM with a peft LoRA adapter, and its optimizer.

One :meth:`Learner.train_step` is one optimizer step on one batch of sequences. The batch is split
into micro-batches by a token budget; each micro-batch's loss is scaled to its share of the full batch
(see :func:`trainer.grpo.grpo_loss`), so gradient accumulation gives the gradient of the whole batch.
The KL reference is the policy training started from: the base model (the same model with its
adapter disabled) or, with ``init_adapter``, that warm start loaded as a second, frozen adapter. No
second model is held in memory.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer.grpo import LossType, entropy_from_logits, grpo_loss, token_logprobs
from trainer.sequences import TrainingSequence, micro_batches_by_token_budget, pad_batch

if TYPE_CHECKING:
    from trainer.config import TrainConfig

log = logging.getLogger(__name__)

TRAINED_ADAPTER = "default"  # peft's name for the adapter it creates or loads first
REFERENCE_ADAPTER = "reference"


@dataclass(frozen=True)
class LoraSettings:
    r: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: list[str] | str = "all-linear"


@dataclass(frozen=True)
class OptimizerSettings:
    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    lr_scheduler_type: str = "constant"
    warmup_steps: int = 0
    max_steps: int = 100
    max_grad_norm: float = 1.0


@dataclass(frozen=True)
class LossSettings:
    loss_type: LossType = "grpo"
    epsilon: float = 0.2
    epsilon_high: float | None = None
    beta: float = 0.0
    tis_cap: float | None = None
    max_completion_length: int | None = None


@dataclass
class StepResult:
    """What one optimizer step did. ``skipped`` is True when a non-finite loss or gradient was found
    and the update was not applied."""

    metrics: dict[str, float] = field(default_factory=dict)
    skipped: bool = False


class Learner:
    """A causal LM with a trainable LoRA adapter, AdamW and a learning-rate schedule.

    ``init_adapter``: a peft adapter directory (e.g. from ``rft sft``) to start from instead of a
    fresh adapter; its LoRA shape wins over ``lora``. With ``beta > 0`` it is also the KL reference:
    the penalty keeps the policy near its warm start (where the tool-call format was learned), not
    near the bare base model.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        lora: LoraSettings = LoraSettings(),
        optimizer: OptimizerSettings = OptimizerSettings(),
        loss: LossSettings = LossSettings(),
        micro_batch_tokens: int = 8192,
        init_adapter: str | Path | None = None,
        seed: int = 0,
    ) -> None:
        from peft import LoraConfig, PeftModel, get_peft_model
        from transformers import AutoModelForCausalLM, get_scheduler

        self.loss_settings = loss
        self.optimizer_settings = optimizer
        self.micro_batch_tokens = micro_batch_tokens
        # LoRA's initial A matrices are drawn from torch's global RNG: seed it for a reproducible start.
        torch.manual_seed(seed)
        base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.reference_adapter: str | None = None
        if init_adapter is not None:
            self.model = PeftModel.from_pretrained(base, str(init_adapter), is_trainable=True)
            if loss.beta > 0.0:
                self.model.load_adapter(str(init_adapter), adapter_name=REFERENCE_ADAPTER, is_trainable=False)
                self.model.set_adapter(TRAINED_ADAPTER)
                self.reference_adapter = REFERENCE_ADAPTER
        else:
            config = LoraConfig(
                r=lora.r,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=lora.target_modules,
                task_type="CAUSAL_LM",
            )
            self.model = get_peft_model(base, config)
        self.model.train()
        pad = self.model.config.pad_token_id
        self.pad_token_id = int(pad if pad is not None else 0)
        self.trainable = [param for _, param in self.model.named_parameters() if param.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.trainable,
            lr=optimizer.learning_rate,
            betas=(optimizer.adam_beta1, optimizer.adam_beta2),
            eps=optimizer.adam_epsilon,
            weight_decay=optimizer.weight_decay,
        )
        self.scheduler = get_scheduler(
            optimizer.lr_scheduler_type,
            self.optimizer,
            num_warmup_steps=optimizer.warmup_steps,
            num_training_steps=optimizer.max_steps,
        )
        self.steps_done = 0
        self.steps_skipped = 0

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """A copy of the adapter's weights, by parameter name."""
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(self.model)
        return {name: tensor.detach().clone() for name, tensor in state.items()}

    def train_step(self, sequences: Sequence[TrainingSequence], *, seed: int | None = None) -> StepResult:
        """One optimizer step on ``sequences`` (each carrying its advantage).

        ``seed`` fixes torch's RNG for this step (LoRA dropout) without touching the caller's RNG, so a
        resumed run draws the same dropout masks as an uninterrupted one.
        """
        if not sequences:
            raise ValueError("train_step needs at least one sequence")
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            return self._train_step(sequences)

    def _train_step(self, sequences: Sequence[TrainingSequence]) -> StepResult:
        settings = self.loss_settings
        total_sequences = len(sequences)
        total_tokens = sum(sequence.num_completion_tokens for sequence in sequences)
        # A rollout's calls may be several sequences (possibly in different micro-batches): the loss
        # averages per episode, so each sequence needs its whole episode's token count.
        episode_tokens: dict[str, int] = {}
        for sequence in sequences:
            episode_tokens[sequence.rollout_id] = (
                episode_tokens.get(sequence.rollout_id, 0) + sequence.num_completion_tokens
            )
        micro_batches = micro_batches_by_token_budget(sequences, self.micro_batch_tokens)
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        weighted: dict[str, float] = {}
        finite = True
        for micro in micro_batches:
            batch = pad_batch(micro, self.pad_token_id)
            ref_logprobs = None
            if settings.beta > 0.0:
                ref_logprobs = self._reference_logprobs(batch.input_ids, batch.attention_mask)
            logits = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
            logprobs = token_logprobs(logits, batch.input_ids)
            with torch.no_grad():
                entropy = entropy_from_logits(logits.detach())
            loss, metrics = grpo_loss(
                logprobs,
                batch.behavior_logprobs,
                batch.advantages,
                batch.loss_mask,
                loss_type=settings.loss_type,
                epsilon=settings.epsilon,
                epsilon_high=settings.epsilon_high,
                max_completion_length=settings.max_completion_length,
                ref_logprobs=ref_logprobs,
                beta=settings.beta,
                tis_cap=settings.tis_cap,
                entropy=entropy,
                episode_tokens=torch.tensor([episode_tokens[sequence.rollout_id] for sequence in micro]),
                total_episodes=len(episode_tokens),
                total_tokens=total_tokens,
            )
            if not torch.isfinite(loss):
                finite = False
                break
            loss.backward()
            loss_sum += float(loss.detach())
            tokens = float(batch.loss_mask.sum())
            for key, value in metrics.items():
                weighted[key] = weighted.get(key, 0.0) + value * tokens
        grad_norm = float("nan")
        if finite:
            grad_norm = float(
                torch.nn.utils.clip_grad_norm_(self.trainable, self.optimizer_settings.max_grad_norm)
            )
            finite = math.isfinite(grad_norm)
        result = StepResult(metrics={key: value / max(total_tokens, 1) for key, value in weighted.items()})
        result.metrics.update(
            loss=loss_sum if finite else float("nan"),
            grad_norm=grad_norm,
            learning_rate=self.scheduler.get_last_lr()[0],
            train_tokens=float(sum(len(sequence) for sequence in sequences)),
            completion_tokens=float(total_tokens),
            sequences=float(total_sequences),
            micro_batches=float(len(micro_batches)),
        )
        if finite:
            self.optimizer.step()
        else:
            result.skipped = True
            self.steps_skipped += 1
            log.warning(
                "non-finite loss or gradient (loss %s, grad norm %s): update skipped (%d skipped so far)",
                result.metrics["loss"],
                grad_norm,
                self.steps_skipped,
            )
        self.optimizer.zero_grad(set_to_none=True)
        # The schedule counts training steps, skipped or not, so it ends where max_steps says (torch
        # warns when it advances past a skipped optimizer step: intended here).
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
            self.scheduler.step()
        self.steps_done += 1
        result.metrics["skipped"] = float(result.skipped)
        result.metrics["steps_skipped"] = float(self.steps_skipped)
        return result

    @torch.no_grad()
    def _reference_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.reference_adapter is None:
            with self.model.disable_adapter():
                logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
            return token_logprobs(logits, input_ids)
        # peft switches which adapter is trainable along with the active one: switch back at once.
        # Eval mode: the reference is a fixed policy, so no LoRA dropout in its pass.
        self.model.set_adapter(self.reference_adapter, inference_mode=True)
        self.model.eval()
        try:
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        finally:
            self.model.train()
            self.model.set_adapter(TRAINED_ADAPTER)
        return token_logprobs(logits, input_ids)

    def save_adapter(self, directory: str | Path) -> Path:
        """Write the adapter in peft format (``adapter_config.json`` + safetensors) to ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        # Only the LoRA weights: peft would also copy the frozen embedding matrices whenever
        # embed_tokens is a target (a full vocabulary's worth on every hot-load).
        self.model.save_pretrained(
            str(directory), selected_adapters=[TRAINED_ADAPTER], save_embedding_layers=False
        )
        return directory

    def training_state(self) -> dict[str, Any]:
        """Optimizer and schedule state plus step counters, for checkpoints."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "steps_done": self.steps_done,
            "steps_skipped": self.steps_skipped,
        }

    def restore(self, adapter_dir: str | Path, training_state: dict[str, Any]) -> None:
        """Load adapter weights saved by :meth:`save_adapter` and the state of :meth:`training_state`."""
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        set_peft_model_state_dict(self.model, load_peft_weights(str(adapter_dir)))
        self.optimizer.load_state_dict(training_state["optimizer"])
        self.scheduler.load_state_dict(training_state["scheduler"])
        self.steps_done = int(training_state["steps_done"])
        self.steps_skipped = int(training_state["steps_skipped"])


def learner_from_config(
    config: TrainConfig, model_dir: str | Path, *, init_adapter: str | Path | None = None
) -> Learner:
    """The learner a :class:`~trainer.config.TrainConfig` describes."""
    return Learner(
        model_dir,
        lora=LoraSettings(
            r=config.lora.r,
            alpha=config.lora.lora_alpha,
            dropout=config.lora.lora_dropout,
            target_modules=config.lora.target_modules,
        ),
        optimizer=OptimizerSettings(
            learning_rate=config.learning_rate,
            weight_decay=config.weight_decay,
            adam_beta1=config.adam_beta1,
            adam_beta2=config.adam_beta2,
            adam_epsilon=config.adam_epsilon,
            lr_scheduler_type=config.lr_scheduler_type,
            warmup_steps=config.warmup_steps,
            max_steps=config.max_steps * config.num_iterations,
            max_grad_norm=config.max_grad_norm,
        ),
        loss=LossSettings(
            loss_type=config.loss_type,
            epsilon=config.epsilon,
            epsilon_high=config.epsilon_high,
            beta=config.beta,
            tis_cap=config.truncated_importance_cap,
            max_completion_length=config.max_completion_length,
        ),
        micro_batch_tokens=config.max_tokens_per_microbatch,
        init_adapter=init_adapter,
        seed=config.seed,
    )
