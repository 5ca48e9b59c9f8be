"""What ``rft export`` exports: a run directory's newest adapter version (or an adapter directory), its
base model, the chat template it was served with, and what the run says about it (steps, evaluation,
config). Files only, no torch."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.ops.status import METRICS_FILE, read_records
from trainer.run import RUN_CONFIG_FILE

ADAPTER_CONFIG = "adapter_config.json"
_VERSION_DIR = re.compile(r"v(\d+)")


class ExportError(Exception):
    """The export cannot be made, or does not behave as the trained policy: the message says why."""


@dataclass(frozen=True)
class ExportSource:
    """The adapter to export and what is known about where it came from."""

    adapter_dir: Path
    base_model: Path
    chat_template: str | None = None
    run_dir: Path | None = None
    version: int | None = None
    steps: int | None = None
    evaluation: dict[str, Any] | None = None
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def lora_rank(self) -> int:
        return int(json.loads((self.adapter_dir / ADAPTER_CONFIG).read_text()).get("r", 16))


def _versions(run_dir: Path) -> dict[int, Path]:
    adapters = run_dir / "adapters"
    if not adapters.is_dir():
        return {}
    found = {}
    for directory in adapters.iterdir():
        match = _VERSION_DIR.fullmatch(directory.name)
        if match and (directory / ADAPTER_CONFIG).is_file():
            found[int(match.group(1))] = directory
    return found


def _is_run(path: Path) -> bool:
    return (path / METRICS_FILE).is_file() or (path / "adapters").is_dir() or (path / "checkpoints").is_dir()


def _adapter_and_run(path: Path) -> tuple[Path, Path | None, int | None]:
    """The adapter directory ``path`` names, and the run and version it belongs to when it is one's."""
    if (path / ADAPTER_CONFIG).is_file():
        match = _VERSION_DIR.fullmatch(path.name)
        run_dir = path.parent.parent
        if match and path.parent.name == "adapters" and _is_run(run_dir):
            return path, run_dir, int(match.group(1))
        return path, None, None
    if _is_run(path):
        versions = _versions(path)
        if not versions:
            raise ExportError(
                f"{path} is a run directory but holds no adapter version yet (adapters/vN is written "
                "after each step): export it after its first step, or name an adapter directory."
            )
        newest = max(versions)
        return versions[newest], path, newest
    raise ExportError(
        f"{path} is neither a run directory (the output_dir of `rft train`, with adapters/vN) nor a peft "
        f"adapter directory (with {ADAPTER_CONFIG}); name one of those."
    )


def _base_model(adapter_dir: Path, config: dict[str, Any], model: Path | None) -> Path:
    """``--model``, else the base the adapter was trained on (peft records the path it was loaded from)."""
    if model is not None:
        candidates = [("--model", model)]
    else:
        recorded = json.loads((adapter_dir / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
        candidates = [(f"{adapter_dir / ADAPTER_CONFIG}", Path(recorded))] if recorded else []
        if config.get("model"):
            candidates.append(("the run's config", Path(config["model"])))
    for _, candidate in candidates:
        if (candidate / "config.json").is_file():
            return candidate.resolve()
    named = "; ".join(f"{where} names {path}" for where, path in candidates) or "none is recorded"
    raise ExportError(
        f"The base model of {adapter_dir} is not a model directory here ({named}): pass --model DIR, "
        "the model directory the adapter was trained on."
    )


def _run_facts(run_dir: Path, version: int) -> tuple[int | None, dict[str, Any] | None]:
    """The steps done when ``version`` was published, and the run's last evaluation."""
    metrics = run_dir / METRICS_FILE
    records = read_records(metrics) if metrics.is_file() else []
    steps = max((int(r["step"]) for r in records if r.get("adapter_version") == version), default=None)
    evaluations = [r["eval"] for r in records if isinstance(r.get("eval"), dict)]
    return steps, evaluations[-1] if evaluations else None


def locate(path: Path, *, model: Path | None = None, chat_template: str | None = None) -> ExportSource:
    """What exporting ``path`` (a run directory or an adapter directory) means; ExportError if nothing."""
    if not path.is_dir():
        raise ExportError(f"{path} is not a directory: name a run directory or a peft adapter directory.")
    adapter_dir, run_dir, version = _adapter_and_run(path)
    config: dict[str, Any] = {}
    if run_dir is not None and (run_dir / RUN_CONFIG_FILE).is_file():
        config = json.loads((run_dir / RUN_CONFIG_FILE).read_text())
    steps, evaluation = _run_facts(run_dir, version) if run_dir is not None and version else (None, None)
    return ExportSource(
        adapter_dir=adapter_dir,
        base_model=_base_model(adapter_dir, config, model),
        chat_template=chat_template or config.get("chat_template"),
        run_dir=run_dir,
        version=version,
        steps=steps,
        evaluation=evaluation,
        config=config,
    )
