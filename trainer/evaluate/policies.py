"""Play a config's evaluation rows on the base model and on adapters, one policy after the other, on
one policy server: the evaluation `rft train` runs (:func:`trainer.rollouts.evaluation.evaluate_policy`),
with no learner and no training."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.config import TrainConfig
from trainer.engine import check_model, model_dir
from trainer.ops.metrics import TokenCost
from trainer.rollouts.evaluation import PlayedEvaluation, evaluate_policy
from trainer.rollouts.fanout import check_agents_listen
from trainer.run import read_eval_rows
from trainer.scale.choices import preflight
from trainer.session import Session, build_engine

log = logging.getLogger(__name__)

BASE = "base"  # the name of the base model (no adapter) among the policies evaluated


class EvalError(Exception):
    """`rft eval` cannot evaluate as asked: the message says what to change."""


@dataclass
class PolicyResult:
    """One policy's evaluation: its name, its adapter (None: the base) and what its rollouts did."""

    name: str
    adapter: Path | None
    played: PlayedEvaluation
    cost: TokenCost

    def row_rewards(self, rows: int) -> list[list[float]]:
        """Each row's scored rewards, in sample order (failed rollouts left out)."""
        rewards: list[list[float]] = [[] for _ in range(rows)]
        for outcome in self.played.outcomes:
            if outcome.ok and outcome.reward is not None:
                rewards[outcome.group_index].append(outcome.reward)
        return rewards


def eval_rows_of(config: TrainConfig, config_path: str) -> list[Any]:
    """The rows `rft train` evaluates on; a config without any is refused with what to set."""
    if config.eval_file is None:
        raise EvalError(
            f"{config_path} has no eval_file, so there is nothing to evaluate on: set eval_file to a "
            "JSONL file of rows (the format of train_file) in the config, or pass --set eval_file=FILE"
        )
    rows = read_eval_rows(config)
    if not rows:
        raise EvalError(f"eval_file {config.eval_file} holds no rows: add JSONL rows to it")
    return rows


def check_adapters(adapters: list[Path]) -> None:
    for adapter in adapters:
        if not (adapter / "adapter_config.json").is_file():
            raise EvalError(
                f"--adapter {adapter} is not a peft adapter directory (it has no adapter_config.json): "
                "name an adapter version of a run, e.g. RUN/adapters/v3"
            )


def evaluate_policies(
    config: TrainConfig, rows: list[Any], *, base: bool, adapters: list[Path], samples: int
) -> list[PolicyResult]:
    """The base (when ``base``), then each adapter, on ``rows`` with ``samples`` rollouts a row.

    The base goes first: a policy server serves the newest adapter it loaded and never goes back.
    Each adapter is served as version 1, 2, ...: the version number does not enter sampling, which
    is seeded per rollout, so an adapter samples here as it did in the run that trained it.
    """
    check_model(config)
    check_agents_listen(config.agents)
    base_model = model_dir(config, config.output_dir)
    config, placement = preflight(config, base_model)  # with the plan's choices (vLLM's share, dtype)
    from trainer.scale.ray_cluster import ray_cluster

    with ray_cluster(config.ray):
        session = Session(config, build_engine(config, base_model, placement))
        try:
            session.start()
            results = []
            if base:
                results.append(_evaluate(session, BASE, None, rows, 0, samples))
            for version, adapter in enumerate(adapters, start=1):
                session.load_adapter(adapter, version)
                results.append(_evaluate(session, _name(adapter), adapter, rows, version, samples))
            return results
        finally:
            session.close()


def _name(adapter: Path) -> str:
    """How the table names an adapter: its path from the working directory when it lies below it."""
    try:
        return str(adapter.relative_to(Path.cwd()))
    except ValueError:
        return str(adapter)


def _evaluate(
    session: Session, name: str, adapter: Path | None, rows: list[Any], version: int, samples: int
) -> PolicyResult:
    print(f"evaluating {name} on {len(rows)} rows x {samples} samples ...", flush=True)
    played = evaluate_policy(session, rows, step=0, adapter_version=version, generations=samples)
    result = played.result
    if result.failed:
        failures = "; ".join(
            f"{cause} x{count}, first: {result.failure_errors.get(cause, '')}"
            for cause, count in result.failures.items()
        )
        if not result.scored:
            raise EvalError(
                f"{name}: all {result.failed} rollouts failed: {failures.rstrip('.')}. "
                "The agents' own logs have the details."
            )
        log.warning("%s: %d rollouts failed, left out of every figure: %s", name, result.failed, failures)
    cost = TokenCost(played.prefill_tokens, played.sample_tokens, 0, session.config.prices)
    return PolicyResult(name, adapter, played, cost)
