"""The trainer-side model: a transformers causal LM with a peft LoRA adapter, and its optimizer.

One :meth:`Learner.train_step` is one optimizer step on one batch of sequences. The batch is split
into micro-batches by a token budget; each micro-batch's loss is scaled to its share of the full batch
(see :func:`trainer.algo.grpo.grpo_loss`), so gradient accumulation gives the gradient of the whole batch.
The KL reference is the policy training started from: the base model (the same model with its
adapter disabled) or, with ``init_adapter``, that warm start loaded as a second, frozen adapter. No
second model is held in memory.

Every setting comes from the :class:`~trainer.config.TrainConfig` (one source of truth). The base
model is loaded in ``learner.dtype`` on ``learner.device`` (bfloat16 on CUDA by default); the LoRA
parameters, their gradients and AdamW's moments stay float32 (peft's ``autocast_adapter_dtype``).
Token logprobs come from the last hidden states through :mod:`trainer.algo.logprobs`, a chunk of
completion positions at a time, so the [B, T, V] logits never exist at once.

A vision-language model (``policy_server.models.vision_inputs.is_vision_model``) loads through
``AutoModelForImageTextToText``; LoRA adapts its language model (``lora.adapt_vision`` widens it,
:func:`trainer.learner.vision.lora_targets`), and sequences that carry images get their pixels back from the
run's image store and M-RoPE positions from the model (:func:`trainer.learner.vision.batch_vision_inputs`).
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from policy_server.models import VisionInputs, is_vision_model
from trainer.algo.logprobs import chunked_token_logprobs, logit_transform
from trainer.algo.sequences import (
    SequenceBatch,
    TrainingSequence,
    micro_batches_by_token_budget,
    pad_batch,
)
from trainer.learner.batch_images import scorable
from trainer.learner.model import TRAINED_ADAPTER, build_model, rng_devices
from trainer.learner.reference import ReferenceCache
from trainer.learner.steps import (
    GradientSums,
    StepResult,
    StepTotals,
    device_and_dtype,
    micro_batch_loss,
    micro_batch_seed,
    to_device,
)
from trainer.learner.vision import batch_vision_inputs

if TYPE_CHECKING:
    from policy_server import ImageStore
    from trainer.config import TrainConfig
    from trainer.scale.placement import Placement

log = logging.getLogger(__name__)


class Learner:
    """A causal LM with a trainable LoRA adapter, AdamW and a learning-rate schedule.

    ``config.init_adapter``: a peft adapter directory (e.g. from ``rft sft``) to start from instead
    of a fresh adapter; its LoRA shape wins over ``config.lora``. With ``beta > 0`` it is also the KL
    reference: the penalty keeps the policy near its warm start (where the tool-call format was
    learned), not near the bare base model. ``placement``: where to run (default: placed on the GPUs
    this machine has, see :mod:`trainer.scale.placement`). ``image_store``: where the images of the
    sequences' calls are (the policy server's), for vision-language models.
    """

    def __init__(
        self,
        model_dir: str | Path,
        config: TrainConfig,
        *,
        placement: Placement | None = None,
        image_store: ImageStore | None = None,
    ) -> None:
        from transformers import get_scheduler

        self.config = config
        self.image_store = image_store
        self.micro_batch_tokens = config.max_tokens_per_microbatch
        self.device, dtype = device_and_dtype(config, placement)
        # LoRA's initial A matrices are drawn from torch's global RNG: seed it for a reproducible start.
        torch.manual_seed(config.seed)
        self.dtype = dtype
        # How the base was loaded (dtype, attention, dequantised from), for the run's record.
        built = build_model(model_dir, config, self._load_device(), dtype)
        self.model, self.reference_adapter, self.base_load = built
        self._distribute()
        base_config = self.model.get_base_model().config
        self.vision = VisionInputs(model_dir, base_config) if is_vision_model(base_config) else None
        self.model.train()
        pad = self.model.config.get_text_config().pad_token_id
        self.pad_token_id = int(pad if pad is not None else 0)
        self.trainable = [param for _, param in self.model.named_parameters() if param.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.trainable,
            lr=config.learning_rate,
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_epsilon,
            weight_decay=config.weight_decay,
        )
        self.scheduler = get_scheduler(
            config.lr_scheduler_type,
            self.optimizer,
            num_warmup_steps=config.warmup_steps,
            # The schedule counts optimizer steps: num_iterations of them per training step.
            num_training_steps=config.max_steps * config.num_iterations,
        )
        self._transform = logit_transform(self.model.config)
        self._reference_cache = ReferenceCache()
        self.steps_done = 0
        self.steps_skipped = 0

    def scorable(self, sequences: Sequence[TrainingSequence]) -> list[TrainingSequence]:
        """The sequences the learner can score exactly (:func:`trainer.learner.batch_images.scorable`)."""
        return scorable(sequences, None if self.vision is None else self.vision.image_token_id)

    def batch_inputs(
        self, micro: Sequence[TrainingSequence]
    ) -> tuple[SequenceBatch, dict[str, torch.Tensor]]:
        """A micro-batch's padded tensors and, for a vision-language model, its image inputs."""
        batch = to_device(pad_batch(micro, self.pad_token_id), self.device)
        if self.vision is None:
            return batch, {}
        extra = batch_vision_inputs(
            self.model, self.vision, self.image_store, micro, batch, self.device, self.dtype
        )
        return batch, extra

    def token_logprobs(
        self, batch: SequenceBatch, vision: dict[str, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logprobs (with grad) and entropies of ``batch``'s completion tokens, [B, T], 0 elsewhere.

        ``vision``: a vision-language model's extra inputs (:meth:`batch_inputs`).
        """
        base = self.model.get_base_model()
        inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "use_cache": False}
        # A VLM's decoder alone would skip the image features and M-RoPE: run its whole inner model.
        decoder = base.model if self.vision is not None else base.get_decoder()
        hidden = decoder(**inputs, **(vision or {})).last_hidden_state
        return chunked_token_logprobs(
            hidden,
            base.get_output_embeddings(),
            batch.input_ids,
            batch.loss_mask,
            chunk_size=self.config.learner.logits_chunk_size,
            transform=self._transform,
        )

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """A copy of the adapter's weights, by parameter name."""
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(self.model)
        return {name: tensor.detach().clone() for name, tensor in state.items()}

    @torch.no_grad()
    def old_logprobs(self, sequences: Sequence[TrainingSequence]) -> list[torch.Tensor]:
        """The learner's logprobs of each sequence now, before the batch's first optimizer pass.

        One 1-D tensor per sequence (its length, 0 off the loss mask), in ``sequences``' order: the
        fixed old policy of the clipped ratio for all of the batch's passes when the sampler/learner
        correction is on (TRL computes the same once per generation batch). Computed in eval mode (no
        LoRA dropout) and in the same micro-batches as :meth:`train_step`, so with no dropout the first
        pass's ratio is exactly 1.
        """
        old = self.shard_old_logprobs(sequences)
        return [old[position] for position in range(len(sequences))]

    @torch.no_grad()
    def shard_old_logprobs(self, sequences: Sequence[TrainingSequence]) -> dict[int, torch.Tensor]:
        """:meth:`old_logprobs` of the sequences in this process's micro-batches, by position."""
        position = {id(sequence): index for index, sequence in enumerate(sequences)}
        micro_batches = micro_batches_by_token_budget(sequences, self.micro_batch_tokens)
        self.model.eval()
        try:
            old: dict[int, torch.Tensor] = {}
            for index, micro in self._shard(micro_batches):
                batch, vision = self.batch_inputs(micro)
                logprobs = self.token_logprobs(batch, vision)[0]
                if index < 0:  # a sharded rank's pass that only keeps its collectives in step
                    continue
                for row, sequence in enumerate(micro):
                    old[position[id(sequence)]] = logprobs[row, : len(sequence)].clone()
        finally:
            self.model.train()
        return old

    def train_step(
        self,
        sequences: Sequence[TrainingSequence],
        *,
        seed: int | None = None,
        old_logprobs: Sequence[torch.Tensor] | None = None,
    ) -> StepResult:
        """One optimizer step on ``sequences`` (each carrying its advantage).

        ``seed`` fixes torch's RNG for this step (LoRA dropout) without touching the caller's RNG, so a
        resumed run draws the same dropout masks as an uninterrupted one; each micro-batch draws from
        its own seed, derived from ``seed`` and its index, so the masks do not depend on which process
        computes it. ``old_logprobs``: from :meth:`old_logprobs` before the batch's first pass, for
        every pass when the sampler/learner correction (``vllm_importance_sampling_correction``) is on;
        unset, this pass's own detached logprobs stand in, which is exact only for a batch's single pass.
        """
        if not sequences:
            raise ValueError("train_step needs at least one sequence")
        if old_logprobs is not None and len(old_logprobs) != len(sequences):
            raise ValueError(f"{len(old_logprobs)} old logprob rows for {len(sequences)} sequences")
        self._reference_cache.start(sequences)
        with torch.random.fork_rng(devices=rng_devices(self.device)):
            return self._train_step(sequences, old_logprobs, seed)

    def _load_device(self) -> torch.device:
        """Where the base model is loaded: this learner's device (a sharded rank's differs)."""
        return self.device

    def _distribute(self) -> None:
        """Spread the model over a process group before the optimizer takes its parameters: nothing
        here; a sharded learner's rank shards it (:mod:`trainer.learner.rank`)."""

    def _shard(
        self, micro_batches: list[list[TrainingSequence]]
    ) -> Iterable[tuple[int, list[TrainingSequence]]]:
        """The micro-batches this process computes, with their index in the step: all of them here;
        a data-parallel worker (:mod:`trainer.learner.distributed`) takes its share."""
        return list(enumerate(micro_batches))

    def _combine(self, sums: GradientSums) -> GradientSums:
        """The whole step's sums (gradients in ``.grad``) from this process's: the same here; a
        data-parallel worker all-reduces them (:mod:`trainer.learner.distributed`)."""
        return sums

    def _accumulate(
        self,
        micro_batches: list[list[TrainingSequence]],
        old_by_sequence: dict[int, torch.Tensor] | None,
        totals: StepTotals,
        seed: int | None,
    ) -> GradientSums:
        """Forward and backward of this process's micro-batches, each loss scaled to its share of the
        whole batch (so the gradients add up to the batch's)."""
        sums = GradientSums()
        for index, micro in self._shard(micro_batches):
            loss, metrics, tokens = self._micro_loss(micro, index, old_by_sequence, totals, seed)
            if not torch.isfinite(loss):
                sums.finite = False
                break
            loss.backward()
            sums.add(float(loss.detach()), metrics, tokens)
        return sums

    def _micro_loss(
        self,
        micro: list[TrainingSequence],
        index: int,
        old_by_sequence: dict[int, torch.Tensor] | None,
        totals: StepTotals,
        seed: int | None,
    ) -> tuple[torch.Tensor, dict[str, float], float]:
        """One micro-batch's loss (scaled to its share of the batch), its metrics and its tokens."""
        if seed is not None:
            torch.manual_seed(micro_batch_seed(seed, index))
        batch, vision = self.batch_inputs(micro)
        ref_logprobs = None
        if self.config.beta > 0.0:
            ref_logprobs = self._reference_cache.logprobs(
                index, micro, lambda: self._reference_logprobs(batch, vision)
            )
        logprobs, entropy = self.token_logprobs(batch, vision)
        old = None
        if old_by_sequence is not None:
            old = [old_by_sequence[id(sequence)] for sequence in micro]
        loss, metrics = micro_batch_loss(
            self.config,
            micro,
            batch,
            logprobs,
            entropy,
            ref_logprobs=ref_logprobs,
            old_logprobs=old,
            totals=totals,
        )
        return loss, metrics, float(batch.loss_mask.sum())

    def _train_step(
        self,
        sequences: Sequence[TrainingSequence],
        old_logprobs: Sequence[torch.Tensor] | None,
        seed: int | None,
    ) -> StepResult:
        config = self.config
        total_sequences = len(sequences)
        totals = StepTotals.of(sequences)
        total_tokens = totals.tokens
        micro_batches = micro_batches_by_token_budget(sequences, self.micro_batch_tokens)
        old_by_sequence = None
        if old_logprobs is not None:
            old_by_sequence = {id(seq): lp for seq, lp in zip(sequences, old_logprobs, strict=True)}
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        sums = self._combine(self._accumulate(micro_batches, old_by_sequence, totals, seed))
        finite, loss_sum, weighted, maxima = sums.finite, sums.loss, sums.weighted, sums.maxima
        grad_norm = float("nan")
        if finite:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.trainable, config.max_grad_norm))
            finite = math.isfinite(grad_norm)
        result = StepResult(metrics={key: value / max(total_tokens, 1) for key, value in weighted.items()})
        result.metrics.update(maxima)
        result.metrics.update(sums.minima)
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
        if self.device.type == "cuda":
            result.metrics["memory_peak_gb"] = torch.cuda.max_memory_allocated(self.device) / 1e9
            # Hand the activations' memory back to the driver: a vLLM sharing this GPU wakes into it.
            torch.cuda.empty_cache()
        return result

    @torch.no_grad()
    def _reference_logprobs(self, batch: SequenceBatch, vision: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.reference_adapter is None:
            with self.model.disable_adapter():
                return self.token_logprobs(batch, vision)[0]
        # peft switches which adapter is trainable along with the active one: switch back at once.
        # Eval mode: the reference is a fixed policy, so no LoRA dropout in its pass.
        self.model.set_adapter(self.reference_adapter, inference_mode=True)
        self.model.eval()
        try:
            return self.token_logprobs(batch, vision)[0]
        finally:
            self.model.train()
            self.model.set_adapter(TRAINED_ADAPTER)

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
