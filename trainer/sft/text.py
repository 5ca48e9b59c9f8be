"""``rft sft``'s training: a fresh LoRA adapter trained on demonstrations, saved in peft format.

Demonstrations are rendered through the model's own chat template exactly as the policy server renders
a rollout (same message normalisation, same template; a ``chat_template`` replaces the model's own, as
the setting of that name does for serving). The adapter is saved in peft format, the same as the GRPO
learner's versions, so ``rft train`` can start from it. Vision-language models: :mod:`trainer.sft.vision`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from trainer.learner.base_load import load_for_training
from trainer.learner.model import check_target_parameters
from trainer.sft.common import (
    DEFAULT_TARGET_MODULES,
    MAX_GRAD_NORM,
    DemonstrationError,
    SftResult,
    StopAtLoss,
    Trainee,
    demonstration_batch,
    encode_each,
    held_out_loss,
    on_device,
    pad_token_id,
    sft_device_and_dtype,
    text_logits,
)
from trainer.sft.turns import encode_demonstration
from trainer.sft.vision import vision_trainee


def trainee_for(
    model_dir: str | Path, demonstrations: Sequence[dict[str, Any]], chat_template: str | Path | None
) -> Trainee:
    """``demonstrations`` encoded for ``model_dir``'s model, text or vision-language."""
    from transformers import AutoConfig

    from policy_server.models import is_vision_model, load_tokenizer

    tokenizer = load_tokenizer(model_dir, chat_template)
    if not demonstrations:
        raise DemonstrationError("no demonstrations to train on")
    config = AutoConfig.from_pretrained(str(model_dir))
    if is_vision_model(config):
        return vision_trainee(model_dir, tokenizer, demonstrations)
    encoded = encode_each(
        demonstrations, lambda demonstration: encode_demonstration(tokenizer, demonstration)
    )
    pad_id = pad_token_id(config)
    return Trainee(
        encoded=encoded,
        load_model=lambda dtype: load_for_training(model_dir, dtype)[0],
        batch=lambda examples: demonstration_batch(examples, pad_id),
        forward=text_logits,
    )


def _with_lora(
    base: Any, r: int, alpha: float, dropout: float, targets: Sequence[str], parameters: Sequence[str]
) -> Any:
    """``base`` with a fresh trainable LoRA adapter on the modules ``targets`` and the (expert)
    parameters ``parameters`` names (peft keeps its weights float32 on a bf16 base)."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(targets),
        target_parameters=list(parameters) or None,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(base, lora)


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
    target_parameters: Sequence[str] = (),
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
    chat_template: str | Path | None = None,
    stop: StopAtLoss | None = None,
    device: str = "auto",
    dtype: str = "auto",
) -> SftResult:
    """Train a fresh LoRA adapter on ``demonstrations`` for ``steps`` AdamW steps; save it to ``out_dir``.

    Each step draws ``batch_size`` demonstrations (seeded) and trains each one's sequences (one, or
    one per turn where the template rewrites earlier turns: ``trainer.sft.turns``). ``on_step(step,
    loss)`` is called after every step (progress display). ``chat_template`` replaces the model's own
    template (a shipped name or a file, see ``policy_server.models.chat_templates``): use the one the
    policy server will use.
    ``target_parameters``: stacked parameters to adapt too, as ``lora.target_parameters`` (an MoE's
    experts, e.g. ``mlp.experts.gate_up_proj``).
    ``stop`` ends the run before ``steps`` once a held-out loss reaches its target. ``device`` and
    ``dtype``: where and in which dtype the base model runs, resolved as the learner's
    (:func:`sft_device_and_dtype`: the first GPU in bfloat16, else the CPU in float32); the LoRA
    weights stay float32.
    """
    if steps < 1 or batch_size < 1:
        raise ValueError("steps and batch_size must be at least 1")
    started = time.monotonic()
    placed, torch_dtype = sft_device_and_dtype(device, dtype)
    trainee = on_device(trainee_for(model_dir, demonstrations, chat_template), placed)
    held_out = (
        None
        if stop is None
        else on_device(trainee_for(model_dir, stop.demonstrations, chat_template), placed)
    )
    encoded = trainee.encoded
    torch.manual_seed(seed)
    base = trainee.load_model(torch_dtype).to(placed)
    check_target_parameters(base, list(target_parameters), model_dir)
    model = _with_lora(base, lora_r, lora_alpha, lora_dropout, target_modules, target_parameters)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=learning_rate)
    rng = random.Random(seed)
    tokens = sum(sum(sequence.loss_mask) for sequences in encoded for sequence in sequences)
    result = SftResult(adapter_dir=Path(out_dir), assistant_tokens=tokens)
    for step in range(1, steps + 1):
        drawn = rng.choices(encoded, k=batch_size)
        loss = trainee.loss(model, trainee.batch([sequence for sequences in drawn for sequence in sequences]))
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
