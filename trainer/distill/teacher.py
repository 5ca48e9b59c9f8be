"""The teacher of on-policy distillation: a model beside the learner that scores the student's tokens.

The teacher never samples: it reads each training sequence (the student's prompt and completion ids,
exactly as the policy server recorded them) and returns its logprob of every sampled token. Scoring
given ids is only meaningful when the teacher reads them as the student wrote them, so a teacher
whose tokenizer maps any text to other ids is refused before anything trains. A teacher served by
vLLM instead scores the same way through its ``prompt_logprobs`` (``trainer/distill/endpoint.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from policy_server.models import is_vision_model, load_tokenizer
from trainer.algo.logprobs import chunked_token_logprobs, logit_transform
from trainer.algo.sequences import TrainingSequence, micro_batches_by_token_budget, pad_batch
from trainer.config import ConfigError, DistillationConfig
from trainer.learner.base_load import load_for_training

log = logging.getLogger(__name__)


class TokenizerMismatch(ConfigError):
    """The teacher's tokenizer is not the policy's: it cannot score the student's token ids."""


def tokenizer_mismatch(teacher: str | Path, policy_dir: str | Path, detail: str) -> TokenizerMismatch:
    """The refusal of a teacher (a directory, or an endpoint's URL and model) whose tokenizer is not the
    policy's; ``detail`` says how they differ."""
    return TokenizerMismatch(
        f"distillation.teacher {teacher} has another tokenizer than the policy {policy_dir} ({detail}): "
        "the teacher scores the student's own token ids, so it must share the policy's tokenizer. Choose "
        "a teacher of the same tokenizer (the same model family and vocabulary), or distil through text "
        "instead: `rft collect` plays the agent with any teacher and writes demonstrations for `rft sft`."
    )


def check_same_tokenizer(policy_dir: str | Path, teacher_dir: str | Path) -> None:
    """Raise :class:`TokenizerMismatch`, in a sentence, unless both directories' tokenizers give every
    token string the same id (their vocabularies, added tokens included, are equal)."""
    policy = load_tokenizer(policy_dir).get_vocab()
    teacher = load_tokenizer(teacher_dir).get_vocab()
    if policy == teacher:
        return
    differing = sorted(
        token for token in policy.keys() | teacher.keys() if policy.get(token) != teacher.get(token)
    )
    examples = ", ".join(
        f"{token!r}: policy {policy.get(token)}, teacher {teacher.get(token)}" for token in differing[:3]
    )
    raise tokenizer_mismatch(teacher_dir, policy_dir, f"{len(differing)} token(s) differ, e.g. {examples}")


class Teacher:
    """A frozen causal LM (a model directory, optionally with a LoRA adapter merged in) that scores
    training sequences: :meth:`score` gives its logprob of each sampled token."""

    def __init__(
        self,
        settings: DistillationConfig,
        policy_dir: str | Path,
        *,
        device: torch.device,
        dtype: torch.dtype,
        micro_batch_tokens: int,
        logits_chunk_size: int = 1024,
    ) -> None:
        if settings.endpoint is not None:
            raise ConfigError(
                f"distillation.teacher {settings.endpoint} is an endpoint: score with EndpointTeacher"
            )
        directory = Path(settings.teacher)
        check_same_tokenizer(policy_dir, directory)
        self.device = device
        self.micro_batch_tokens = micro_batch_tokens
        self.logits_chunk_size = logits_chunk_size
        placed: dict[str, Any] = {"device_map": {"": str(device)}} if device.type == "cuda" else {}
        model, _ = load_for_training(directory, dtype, **placed)
        if is_vision_model(model.config):
            raise ConfigError(
                f"distillation.teacher {directory} is a vision-language model: the teacher scores "
                "text sequences only for now; distil a text model, or use `rft collect` and `rft sft`"
            )
        if settings.teacher_adapter is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(settings.teacher_adapter)).merge_and_unload()
        self.model = model.to(device).eval()
        for parameter in self.model.parameters():
            parameter.requires_grad_(False)
        pad = self.model.config.get_text_config().pad_token_id
        self.pad_token_id = int(pad if pad is not None else 0)
        self._transform = logit_transform(self.model.config)
        adapter = f" with adapter {settings.teacher_adapter}" if settings.teacher_adapter else ""
        log.info("distillation teacher %s%s loaded on %s (%s)", directory, adapter, device, dtype)

    @torch.no_grad()
    def score(self, sequences: Sequence[TrainingSequence]) -> list[torch.Tensor]:
        """The teacher's logprob of each sequence's tokens, one 1-D float32 CPU tensor per sequence
        (its length; 0 off the loss mask), in ``sequences``' order."""
        position = {id(sequence): index for index, sequence in enumerate(sequences)}
        scored: list[torch.Tensor | None] = [None] * len(sequences)
        for micro in micro_batches_by_token_budget(sequences, self.micro_batch_tokens):
            batch = pad_batch(micro, self.pad_token_id)
            input_ids = batch.input_ids.to(self.device)
            hidden = self.model.get_decoder()(
                input_ids=input_ids, attention_mask=batch.attention_mask.to(self.device), use_cache=False
            ).last_hidden_state
            logprobs, _ = chunked_token_logprobs(
                hidden,
                self.model.get_output_embeddings(),
                input_ids,
                batch.loss_mask.to(self.device),
                chunk_size=self.logits_chunk_size,
                transform=self._transform,
            )
            for row, sequence in enumerate(micro):
                scored[position[id(sequence)]] = logprobs[row, : len(sequence)].float().cpu()
        return [tensor for tensor in scored if tensor is not None]
