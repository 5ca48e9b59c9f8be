"""The accounting of one optimizer step: what it did (:class:`StepResult`), what micro-batches add up
to (:class:`GradientSums`, merged across data-parallel workers), the batch-wide counts every
micro-batch's loss is normalised by, and where the learner's tensors live."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from trainer.algo.fidelity import fidelity_metrics
from trainer.algo.grpo import grpo_loss
from trainer.algo.sequences import SequenceBatch, TrainingSequence, right_pad

if TYPE_CHECKING:
    from trainer.config import TrainConfig
    from trainer.scale.placement import Placement


@dataclass
class StepResult:
    """What one optimizer step did. ``skipped`` is True when a non-finite loss or gradient was found
    and the update was not applied."""

    metrics: dict[str, float] = field(default_factory=dict)
    skipped: bool = False


@dataclass
class GradientSums:
    """What one process's micro-batches add to a step (their gradients sit in the parameters' .grad).

    ``loss``: the sum of their losses (each already scaled to its share of the batch); ``weighted``:
    token-weighted sums of per-micro-batch metric means; ``maxima``: the ``*_max`` metrics;
    ``minima``: the ``*_min`` metrics; ``finite``: False once a loss was not finite."""

    loss: float = 0.0
    weighted: dict[str, float] = field(default_factory=dict)
    maxima: dict[str, float] = field(default_factory=dict)
    minima: dict[str, float] = field(default_factory=dict)
    finite: bool = True

    def add(self, loss: float, metrics: dict[str, float], tokens: float) -> None:
        """Count one micro-batch: its loss, and its metrics weighted by its ``tokens``."""
        self.loss += loss
        for key, value in metrics.items():
            if key.endswith("_max"):
                self.maxima[key] = max(self.maxima.get(key, value), value)
            elif key.endswith("_min"):
                self.minima[key] = min(self.minima.get(key, value), value)
            else:
                self.weighted[key] = self.weighted.get(key, 0.0) + value * tokens

    def merge(self, other: GradientSums) -> None:
        """Add another process's sums (not its gradients) to these."""
        self.loss += other.loss
        self.finite = self.finite and other.finite
        for key, value in other.weighted.items():
            self.weighted[key] = self.weighted.get(key, 0.0) + value
        for key, value in other.maxima.items():
            self.maxima[key] = max(self.maxima.get(key, value), value)
        for key, value in other.minima.items():
            self.minima[key] = min(self.minima.get(key, value), value)


@dataclass(frozen=True)
class StepTotals:
    """Counts over the whole batch that every micro-batch's loss is normalised by."""

    tokens: int
    episode_tokens: dict[str, int]

    @classmethod
    def of(cls, sequences: Sequence[TrainingSequence]) -> StepTotals:
        # A rollout's calls may be several sequences (possibly in different micro-batches): the loss
        # averages per episode, so each sequence needs its whole episode's token count.
        episode_tokens: dict[str, int] = {}
        for sequence in sequences:
            episode_tokens[sequence.rollout_id] = (
                episode_tokens.get(sequence.rollout_id, 0) + sequence.num_completion_tokens
            )
        return cls(sum(sequence.num_completion_tokens for sequence in sequences), episode_tokens)


def micro_batch_loss(
    config: TrainConfig,
    micro: Sequence[TrainingSequence],
    batch: SequenceBatch,
    logprobs: torch.Tensor,
    entropy: torch.Tensor,
    *,
    ref_logprobs: torch.Tensor | None,
    old_logprobs: Sequence[torch.Tensor] | None,
    totals: StepTotals,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO loss of ``micro`` (padded into ``batch``), scaled by the whole batch's counts
    (``totals``) so that the micro-batches' losses, wherever each is computed, add up to the batch's;
    and its metrics with the sampler/learner agreement (:func:`trainer.algo.fidelity.fidelity_metrics`)."""
    correction = config.vllm_importance_sampling_mode if config.vllm_importance_sampling_correction else None
    old = None
    if old_logprobs is not None:
        old = right_pad(
            list(old_logprobs), 0, logprobs.dtype, width=logprobs.shape[1], device=logprobs.device
        )
    loss, metrics = grpo_loss(
        logprobs,
        batch.behavior_logprobs,
        batch.advantages,
        batch.loss_mask,
        loss_type=config.loss_type,
        epsilon=config.epsilon,
        epsilon_high=config.epsilon_high,
        max_completion_length=config.max_completion_length,
        ref_logprobs=ref_logprobs,
        beta=config.beta,
        use_bias_correction_kl=config.use_bias_correction_kl,
        importance_sampling_mode=correction,
        importance_sampling_cap=config.vllm_importance_sampling_cap,
        old_logprobs=old,
        entropy=entropy,
        episode_tokens=torch.tensor(
            [totals.episode_tokens[sequence.rollout_id] for sequence in micro],
            device=logprobs.device,
        ),
        total_episodes=len(totals.episode_tokens),
        total_tokens=totals.tokens,
    )
    high = config.epsilon if config.epsilon_high is None else config.epsilon_high
    metrics.update(
        fidelity_metrics(
            logprobs, batch.behavior_logprobs, batch.loss_mask, epsilon=config.epsilon, epsilon_high=high
        )
    )
    return loss, metrics


def micro_batch_seed(seed: int, index: int) -> int:
    """The RNG seed of a step's ``index``-th micro-batch (LoRA dropout), whichever process runs it."""
    digest = hashlib.sha256(f"{seed}:micro-batch:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & 0x7FFFFFFFFFFFFFFF


def device_and_dtype(config: TrainConfig, placement: Placement | None) -> tuple[torch.device, torch.dtype]:
    from trainer.scale.placement import detect_gpus, node_for, place

    if placement is None:
        placement = place(config, node_for(config, detect_gpus()))
    device = torch.device(placement.learner_device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"the learner is placed on {device} but torch sees no CUDA device (torch "
            f"{torch.__version__}, CUDA build: {torch.version.cuda or 'none'}): set learner.device: cpu, "
            "or install a CUDA build of torch on a machine with a GPU"
        )
    return device, getattr(torch, placement.learner_dtype)


def to_device(batch: SequenceBatch, device: torch.device) -> SequenceBatch:
    if device.type == "cpu":
        return batch
    return SequenceBatch(*(getattr(batch, item.name).to(device) for item in dataclasses.fields(batch)))
