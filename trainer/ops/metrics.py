"""Run metrics: per-step JSONL, an MLflow run, tokens and dollars, the before/after evaluation table."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.config import TokenPrices

METRICS_FILE = "metrics.jsonl"  # one JSON record per step, in run_dir
_EVAL_TABLE = "eval_table"


@dataclass(frozen=True)
class TokenCost:
    """Tokens by bucket and what they would cost."""

    prefill_tokens: int
    sample_tokens: int
    train_tokens: int
    prices: TokenPrices

    @property
    def dollars(self) -> float:
        return (
            self.prefill_tokens * self.prices.prefill
            + self.sample_tokens * self.prices.sample
            + self.train_tokens * self.prices.train
        ) / 1_000_000


NO_MLFLOW = "none"  # the tracking URI that turns MLflow off (the JSONL and the sinks stay)


class MetricsLogger:
    """Writes each step's record to ``run_dir/metrics.jsonl`` and to an MLflow run.

    On resume, pass the checkpoint's step and MLflow run id: records after that step (written by the
    run that died before checkpointing them) are dropped from the JSONL, and the same MLflow run
    continues. ``tracking_uri="none"`` (:data:`NO_MLFLOW`): no MLflow run, and mlflow is not imported
    (a machine without it still trains and writes the JSONL).
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        tracking_uri: str,
        experiment: str = "rftkit",
        run_name: str | None = None,
        resume_run_id: str | None = None,
        resume_step: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.run_dir / METRICS_FILE
        # Called with (step, record) after each step is written: the Prometheus exporter, for one.
        self.sinks: list[Callable[[int, dict[str, Any]], None]] = []
        if resume_step is not None:
            self._truncate_after(resume_step)
        uri = tracking_uri
        self.tracking_uri = uri
        self._client: Any = None
        self.mlflow_run_id: str | None = resume_run_id
        if uri == NO_MLFLOW:
            return
        if uri.startswith("file:"):
            # mlflow-skinny has no database backend; its file store must be opted into.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=uri)
        if resume_run_id is not None:
            self.mlflow_run_id = resume_run_id
            self._client.update_run(resume_run_id, status="RUNNING")
        else:
            found = self._client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found else self._client.create_experiment(experiment)
            self.mlflow_run_id = self._client.create_run(experiment_id, run_name=run_name).info.run_id

    def _truncate_after(self, step: int) -> None:
        if not self.jsonl_path.exists():
            return
        kept = [
            line
            for line in self.jsonl_path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= step
        ]
        self.jsonl_path.write_text("".join(f"{line}\n" for line in kept))

    def log_params(self, params: dict[str, Any]) -> None:
        if self._client is None:
            return
        from mlflow.entities import Param

        # MLflow caps a batch at 100 params and a value at 6000 characters.
        items = [Param(key, str(value)[:6000]) for key, value in sorted(params.items())]
        for start in range(0, len(items), 100):
            self._client.log_batch(self.mlflow_run_id, params=items[start : start + 100])

    def log_step(self, step: int, record: dict[str, Any]) -> None:
        """Append ``record`` (plus the step and a timestamp) to the JSONL; numbers go to MLflow."""
        self.write_line(step, record)
        if self._client is not None:
            self._log_mlflow(step, record)
        for sink in self.sinks:
            sink(step, record)

    def write_line(self, step: int, record: dict[str, Any]) -> None:
        """Append ``record`` (plus the step and a timestamp) to the JSONL only, as strict JSON: a NaN or
        infinite number is written null (JavaScript's and jq's parsers refuse bare NaN)."""
        line = strict_json({"step": step, "time": time.time(), **record})
        with open(self.jsonl_path, "a") as handle:
            handle.write(json.dumps(line, allow_nan=False) + "\n")

    def _log_mlflow(self, step: int, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(key, float(value), now, step)
            for key, value in _flatten(record).items()
            if math.isfinite(value)
        ]
        for start in range(0, len(metrics), 1000):
            self._client.log_batch(self.mlflow_run_id, metrics=metrics[start : start + 1000])

    def log_artifact(self, local_path: Path, artifact_path: str | None = None) -> None:
        """Copy a file (or a directory's files) into the MLflow run's artifacts, under ``artifact_path``."""
        path = Path(local_path)
        if self._client is None:
            return
        if path.is_dir():
            self._client.log_artifacts(self.mlflow_run_id, str(path), artifact_path)
        else:
            self._client.log_artifact(self.mlflow_run_id, str(path), artifact_path)

    def close(self, *, failed: bool = False) -> None:
        if self._client is None:
            return
        self._client.set_terminated(self.mlflow_run_id, status="FAILED" if failed else "FINISHED")


def strict_json(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None, at any depth."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(item) for item in value]
    return value


def _flatten(record: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a nested record, keys joined with '/' (MLflow's metric names)."""
    flat: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}/"))
        elif isinstance(value, bool):
            flat[name] = float(value)
        elif isinstance(value, int | float):
            flat[name] = float(value)
    return flat


def eval_table_markdown(before: dict[str, Any], after: dict[str, Any]) -> str:
    """The before/after evaluation table shown at the end of a run."""
    rows = [
        ("success rate", f"{before['success_rate']:.1%}", f"{after['success_rate']:.1%}"),
        ("mean reward", f"{before['mean_reward']:.4f}", f"{after['mean_reward']:.4f}"),
        ("scored rollouts", str(before["scored"]), str(after["scored"])),
        ("failed rollouts", str(before["failed"]), str(after["failed"])),
    ]
    lines = [
        f"| metric | before (step {before['step']}) | after (step {after['step']}) |",
        "|---|---|---|",
        *(f"| {name} | {first} | {last} |" for name, first, last in rows),
    ]
    return "\n".join(lines) + "\n"


def write_eval_table(run_dir: Path, before: dict[str, Any], after: dict[str, Any]) -> str:
    """Write ``eval_table.md`` and ``eval_table.json`` in the run directory; return the markdown."""
    table = eval_table_markdown(before, after)
    (Path(run_dir) / f"{_EVAL_TABLE}.md").write_text(table)
    both = {"before": before, "after": after}
    (Path(run_dir) / f"{_EVAL_TABLE}.json").write_text(json.dumps(both, indent=1))
    return table


def cost_summary(cost: TokenCost) -> str:
    """One line for the end-of-run report."""
    return (
        f"tokens: prefill {cost.prefill_tokens:,}, sample {cost.sample_tokens:,}, "
        f"train {cost.train_tokens:,}; estimated cost ${cost.dollars:.4f} "
        f"(at ${cost.prices.prefill:.2f}/M prefill, ${cost.prices.sample:.2f}/M sample, "
        f"${cost.prices.train:.2f}/M train)"
    )
