"""``rft demo --warm-start RUN``: start GRPO from the model and warm-start adapter of an earlier demo
run instead of training them again, as long as that run built them with the same sizes and seed.

Every run records what its warm start was made from in ``warm-start.json`` (the plan's model and
warm-start fields, the seed, the base model, the chat template, the adapted modules and the warm
start's losses). A run given ``--warm-start RUN`` reads that record, refuses with a sentence when any
of those differ from its own, and copies ``RUN/model`` (for a model built offline) and
``RUN/sft-adapter`` into its own directory, so the new run holds everything ``rft eval`` and a rerun
need. The warm start is deterministic (same seed, same adapter, byte for byte), so the reused one is
the one the run would have trained: a second plan (``--ray``, another GRPO size) costs only its GRPO
stage.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agents.maze.demo.plans import DemoPlan
from trainer.sft import SftResult

RECORD_FILE = "warm-start.json"
# What decides the model built offline and its warm-start adapter; the GRPO and evaluation sizes do not.
WARM_START_FIELDS = (
    "observation",
    "hidden_size",
    "num_layers",
    "vision_rope_theta",
    "vision_mrope",
    "sft_demos",
    "sft_steps",
    "sft_noise",
    "sft_labels",
    "sft_target_loss",
    "sft_learning_rate",
    "sft_batch_size",
    "lora_r",
    "lora_alpha",
)


class WarmStartMismatch(ValueError):
    """The run named by ``--warm-start`` made its warm start from other sizes, seed or model."""


def _made_from(plan: DemoPlan, seed: int, model: Path | None, chat_template: str | None) -> dict[str, Any]:
    """The record's key: what the model and the warm start were made from (JSON-shaped)."""
    fields = asdict(plan)
    made = {name: fields[name] for name in WARM_START_FIELDS}
    made["vision_mrope"] = list(made["vision_mrope"])
    made.update(seed=seed, model=str(model) if model is not None else None, chat_template=chat_template)
    return made


def record_warm_start(
    run_dir: Path,
    plan: DemoPlan,
    *,
    seed: int,
    model: Path | None,
    chat_template: str | None,
    target_modules: list[str],
    sft: SftResult,
) -> None:
    """Write ``run_dir/warm-start.json`` once the warm start is done, for a later ``--warm-start``."""
    record = {
        "made_from": _made_from(plan, seed, model, chat_template),
        "target_modules": target_modules,
        "losses": sft.losses,
        "held_out_losses": {str(step): loss for step, loss in sft.held_out_losses.items()},
        "seconds": sft.seconds,
        "assistant_tokens": sft.assistant_tokens,
    }
    (run_dir / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")


def _differences(wanted: dict[str, Any], found: dict[str, Any]) -> list[str]:
    return [
        f"{name} {found.get(name)!r} there, {value!r} here"
        for name, value in wanted.items()
        if found.get(name) != value
    ]


def reuse_warm_start(
    source: Path,
    run_dir: Path,
    plan: DemoPlan,
    *,
    seed: int,
    model: Path | None,
    chat_template: str | None,
) -> tuple[Path, list[str], SftResult]:
    """Copy ``source``'s model (when built offline) and warm-start adapter into ``run_dir``; returns
    the model directory, the adapted modules and the warm start as the source recorded it."""
    record_path = source / RECORD_FILE
    if not record_path.is_file():
        raise WarmStartMismatch(
            f"--warm-start {source}: no {RECORD_FILE} there; name the directory of an earlier `rft demo` "
            "run (the --out of a run that finished its warm start)"
        )
    record = json.loads(record_path.read_text())
    differences = _differences(_made_from(plan, seed, model, chat_template), record["made_from"])
    if differences:
        raise WarmStartMismatch(
            f"--warm-start {source}: that run's warm start was made differently ({'; '.join(differences)}); "
            "run the demo with the same plan and seed, or leave --warm-start out to train one"
        )
    if model is None:
        model = run_dir / "model"
        shutil.copytree(source / "model", model, dirs_exist_ok=True)
    adapter_dir = run_dir / "sft-adapter"
    shutil.copytree(source / "sft-adapter", adapter_dir, dirs_exist_ok=True)
    shutil.copyfile(record_path, run_dir / RECORD_FILE)
    sft = SftResult(
        adapter_dir=adapter_dir,
        losses=record["losses"],
        seconds=record["seconds"],
        assistant_tokens=record["assistant_tokens"],
        held_out_losses={int(step): loss for step, loss in record["held_out_losses"].items()},
    )
    return model, record["target_modules"], sft
