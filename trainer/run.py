"""One run's setup and teardown: its rows, learner, checkpoint state, metrics and policy server
(:class:`Run`, opened by :func:`open_run`), the adapter it starts from, its evaluations, and what it
produced (:class:`RunSummary`).
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from policy_server import ImageStore, TokenCounters
from policy_server.models.families import Parsers
from trainer.config import TrainConfig
from trainer.distill import open_teacher
from trainer.engine import engine_parsers, model_dir
from trainer.errors import TrainingError
from trainer.learner.checkpoint import LoadedCheckpoint, RunState, latest_checkpoint, load_checkpoint
from trainer.learner.group import uses_process_group
from trainer.learner.learner import Learner
from trainer.ops.metrics import MetricsLogger, TokenCost, cost_summary, write_eval_table
from trainer.ops.prometheus import StepExporter
from trainer.ops.transcripts import TranscriptKeeper
from trainer.rollouts.dataset import next_rows, prompts, read_rows
from trainer.rollouts.evaluation import EvalResult, evaluate_policy
from trainer.rollouts.pipeline import RolloutPipeline
from trainer.rollouts.producer import PlayedRollout
from trainer.scale.choices import preflight
from trainer.session import Session, build_engine

if TYPE_CHECKING:
    from trainer.distill import Scorer
    from trainer.learner.distributed import RayLearner
    from trainer.learner.processes import ProcessLearner
    from trainer.scale.placement import Placement

log = logging.getLogger(__name__)

ADAPTERS_KEPT = 2  # the version being served and the one before it (calls may still be using it)
LOG_FILE = "train.log"
RUN_CONFIG_FILE = "config.json"  # the run's config as it started, secrets left out
LOG_HANDLER_NAME = "rftkit-train-log"  # the handler writing LOG_FILE, found by name to write it alone


@dataclass
class RunSummary:
    """What a finished run produced."""

    run_dir: Path
    steps: int
    adapter_dir: Path | None
    adapter_version: int
    evaluations: list[dict[str, Any]]
    cost: TokenCost
    history: list[dict[str, Any]] = field(default_factory=list)
    eval_table: str | None = None


# Called after every evaluation with its step, the played rollouts (traces included) and the run's
# metrics logger: how a caller shows what the policy did (``rft demo``'s episode gallery).
EvaluationHook = Callable[[int, list[PlayedRollout], MetricsLogger], None]


@dataclass
class Run:
    """What every step of one run shares: its data, learner, bookkeeping, metrics and policy server."""

    config: TrainConfig
    train_rows: list[Any]
    eval_rows: list[Any]
    learner: Learner | RayLearner | ProcessLearner
    state: RunState
    resumed_from: Path | None
    metrics: MetricsLogger
    session: Session
    pipeline: RolloutPipeline
    loaded: LoadedCheckpoint | None = None
    totals: dict[str, int] = field(default_factory=dict)
    counted: TokenCounters = field(default_factory=TokenCounters)  # the server's counters at the last step
    on_evaluation: EvaluationHook | None = None
    transcripts: TranscriptKeeper | None = None  # a few episodes of each step and evaluation, for `rft show`
    parsers: Parsers | None = None  # the engine's tool-call and reasoning parsers, named by fidelity stops
    teacher: Scorer | None = None  # on-policy distillation's (the distillation section)

    @property
    def run_dir(self) -> Path:
        return self.config.output_dir

    @property
    def checkpoint_dir(self) -> Path:
        return self.config.output_dir / "checkpoints"

    @property
    def adapters_kept(self) -> int:
        """Adapter directories kept: also those the rollouts in flight sample on (asynchronous)."""
        return max(ADAPTERS_KEPT, self.config.max_off_policy_steps + 2)

    def pick_rows(self) -> list[tuple[int, Any]]:
        """The next step's rows (with their indices); the data position moves on."""
        config = self.config
        picked, self.state.position = next_rows(
            self.train_rows,
            config.rows_per_step,
            self.state.position,
            seed=config.seed,
            shuffle=config.shuffle,
        )
        return picked


def open_run(config: TrainConfig, resume: bool) -> Run:
    """Rows, the learner (restored on resume), the metrics logger and the (not yet started) server."""
    run_dir = config.output_dir
    checkpoint_dir = run_dir / "checkpoints"
    if not resume and latest_checkpoint(checkpoint_dir) is not None:
        raise TrainingError(
            f"{run_dir} already holds a run (checkpoints in {checkpoint_dir}): pass --resume to continue "
            "it, or choose another output_dir"
        )
    train_rows, eval_rows = _rows(config)
    base_model = model_dir(config, run_dir)
    parsers = engine_parsers(config, base_model)  # an unknown family stops here, before anything loads

    # The memory plan (refuses a config that cannot fit) and the settings it chose, which the learner,
    # the engine (vLLM's share, dtype, sleep mode) and the rest of the run use; then where it stands.
    config, placement = preflight(config, base_model)
    # Images of the calls being trained on, once each, until the update is done with their traces.
    images = ImageStore(run_dir / "images")
    learner = _learner(config, base_model, placement, images)
    try:
        state, resumed_from, loaded = _restore(learner, checkpoint_dir, resume)
    except BaseException:
        close_learner(learner)
        raise
    metrics = _metrics_logger(config, state, resumed_from)
    if isinstance(learner, Learner) and not resumed_from:
        # What the learner's base was loaded as (the config says "auto"; this is what it resolved to).
        metrics.log_params(learner.base_load.params())
    session = Session(config, build_engine(config, base_model, placement), images)
    metrics.sinks.append(StepExporter(session.server.metrics.registry).publish)
    pipeline = RolloutPipeline(
        session.producer,
        max_off_policy_steps=config.max_off_policy_steps,
        max_steps=config.max_steps,
        make_requests=session.train_requests,
    )
    run = Run(config, train_rows, eval_rows, learner, state, resumed_from, metrics, session, pipeline, loaded)
    run.transcripts = TranscriptKeeper(
        run_dir, config.transcripts, config.seed, base_model, config.chat_template
    )
    run.parsers = parsers
    run.teacher = open_teacher(config, base_model, learner)
    return run


def _learner(
    config: TrainConfig, base_model: Path, placement: Placement, images: ImageStore
) -> Learner | RayLearner | ProcessLearner:
    """One learner in this process, learner processes of this node (``learner.processes``,
    ``learner.shard``), or learner workers on Ray (a ``ray`` section)."""
    if config.ray is not None:
        from trainer.learner.distributed import RayLearner

        return RayLearner(base_model, config, placement=placement, image_store=images)
    if uses_process_group(config):
        from trainer.learner.processes import ProcessLearner

        return ProcessLearner(base_model, config, placement=placement, image_store=images)
    return Learner(base_model, config, placement=placement, image_store=images)


def close_learner(learner: Learner | RayLearner | ProcessLearner) -> None:
    """Stop the learner processes this run started (a learner in this process, or Ray's workers,
    which end with the cluster, need nothing)."""
    from trainer.learner.processes import ProcessLearner

    if isinstance(learner, ProcessLearner):
        learner.close()


def _rows(config: TrainConfig) -> tuple[list[Any], list[Any]]:
    """The training rows and the evaluation rows."""
    train_rows = prompts(read_rows(config.train_file), config.prompt_column, config.train_file)
    return train_rows, read_eval_rows(config)


def read_eval_rows(config: TrainConfig) -> list[Any]:
    """The evaluation rows: the first ``max_eval_rows`` of ``eval_file`` (none without one)."""
    rows = []
    if config.eval_file is not None:
        rows = prompts(read_rows(config.eval_file), config.prompt_column, config.eval_file)
    return rows[: config.max_eval_rows] if config.max_eval_rows else rows


def _restore(
    learner: Learner | RayLearner | ProcessLearner, checkpoint_dir: Path, resume: bool
) -> tuple[RunState, Path | None, LoadedCheckpoint | None]:
    """Where the run stands: a fresh state, or (resuming) the newest checkpoint's, loaded into the learner."""
    state = RunState()
    resumed_from: Path | None = None
    loaded: LoadedCheckpoint | None = None
    if resume:
        resumed_from = latest_checkpoint(checkpoint_dir)
        if resumed_from is None:
            raise TrainingError(f"--resume: no checkpoint in {checkpoint_dir}; start without --resume")
        loaded = load_checkpoint(resumed_from, learner)
        state = loaded.state
        log.info("resumed from %s at step %d", resumed_from, state.step)
    return state, resumed_from, loaded


def _metrics_logger(config: TrainConfig, state: RunState, resumed_from: Path | None) -> MetricsLogger:
    """The run's metrics logger (MLflow run continued on resume); a fresh run logs the config."""
    run_dir = config.output_dir
    metrics = MetricsLogger(
        run_dir,
        tracking_uri=config.mlflow_uri,
        experiment=config.mlflow_experiment_name,
        run_name=config.run_name or run_dir.name,
        resume_run_id=state.mlflow_run_id,
        resume_step=state.step if resumed_from else None,
    )
    state.mlflow_run_id = metrics.mlflow_run_id
    if not resumed_from:
        params = config.model_dump(mode="json", exclude={"policy_server": {"api_key"}})
        metrics.log_params(params)
        # Read back by `rft export` for the model card and the chat template the policy was served with.
        (run_dir / RUN_CONFIG_FILE).write_text(json.dumps(params, indent=1))
    return metrics


def serve_start_adapter(run: Run) -> None:
    """Serve the adapter the run starts from: the checkpoint's, or the warm start as version 1.

    A resumed asynchronous run first loads the older adapters its steps in flight sampled on, and
    submits those steps again (finished rollouts kept, the rest played again).
    """
    state, pipeline, loaded = run.state, run.pipeline, run.loaded
    if loaded is not None:
        directories = dict(loaded.pinned_adapters)
        if state.adapter_version > 0:
            directories[state.adapter_version] = loaded.adapter_dir
        missing = {saved["adapter_version"] for saved in loaded.in_flight} - {0, *directories}
        if missing:
            raise TrainingError(
                f"{loaded.path} holds rollouts in flight on adapter versions {sorted(missing)} but not "
                "those adapters; resume from an earlier checkpoint"
            )
        # Oldest first, each version's steps submitted (so pinned) before a newer load retires it.
        for version in sorted({0, *directories}):
            if version > 0:
                run.session.load_adapter(directories[version], version)
            steps = [saved for saved in loaded.in_flight if saved["adapter_version"] == version]
            pipeline.resume(steps, run.train_rows)
    elif run.config.init_adapter is not None:
        # The warm-start adapter is version 1: the first evaluation and step sample with it.
        state.adapter_version = 1
        directory = save_version(run.learner, run.run_dir, state.adapter_version, run.adapters_kept)
        run.session.load_adapter(directory, state.adapter_version)


def evaluate_run(run: Run, step: int) -> EvalResult:
    """Play the evaluation rows with the current adapter and keep the result in the run's state."""

    def keep(played: list[PlayedRollout]) -> None:
        if run.transcripts is not None:
            run.transcripts.keep_eval(step, played)
        if run.on_evaluation is not None:
            run.on_evaluation(step, played, run.metrics)

    result = evaluate_policy(
        run.session,
        run.eval_rows,
        step=step,
        adapter_version=run.state.adapter_version,
        generations=run.config.eval_generations,
        keep=keep,
    ).result
    record_evaluation(run, step, result)
    return result


def record_evaluation(run: Run, step: int, result: EvalResult) -> None:
    """Keep the result in the run's state; warn about failed rollouts, stop when none was scored."""
    run.state.evaluations.append(result.as_dict())
    if result.failed:
        failures = "; ".join(
            f"{cause} x{count}, first: {result.failure_errors.get(cause, '')}"
            for cause, count in result.failures.items()
        )
        if not result.scored:
            error = TrainingError(
                f"evaluation at step {step}: all {result.failed} rollouts failed: {failures.rstrip('.')}. "
                "The agents' own logs have the details."
            )
            # The step's record is never written, so metrics.jsonl keeps what stopped the run.
            run.metrics.write_line(step, {"eval": result.as_dict(), "stopped": str(error)})
            raise logged_stop(error)
        log.warning("eval at step %d: %d rollouts failed: %s", step, result.failed, failures)
    log.info("eval at step %d: success %.3f, mean reward %.4f", step, result.success_rate, result.mean_reward)


def save_version(
    learner: Learner | RayLearner | ProcessLearner, run_dir: Path, version: int, keep: int = ADAPTERS_KEPT
) -> Path:
    """A fresh directory per adapter version; older ones beyond ``keep`` are removed."""
    adapters = run_dir / "adapters"
    directory = adapters / f"v{version}"
    if directory.exists():  # left by a run that died before checkpointing this version
        shutil.rmtree(directory)
    learner.save_adapter(directory)
    for old in sorted(adapters.glob("v*"), key=lambda path: int(path.name[1:]))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return directory


def add_log_file(run_dir: Path) -> logging.Handler:
    handler = logging.FileHandler(run_dir / LOG_FILE)
    handler.set_name(LOG_HANDLER_NAME)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("trainer").addHandler(handler)
    logging.getLogger("trainer").setLevel(logging.INFO)
    return handler


def logged_stop(error: TrainingError) -> TrainingError:
    """``error``, written into ``train.log`` only: `rft train` prints it on the console itself."""
    trainer_log = logging.getLogger("trainer")
    record = trainer_log.makeRecord(log.name, logging.ERROR, __file__, 0, "%s", (error,), None)
    for handler in trainer_log.handlers:
        if handler.get_name() == LOG_HANDLER_NAME:
            handler.handle(record)
    return error


def totals_of(history: list[dict[str, Any]]) -> dict[str, int]:
    last = history[-1]["tokens"] if history else {}
    return {key: int(last.get(f"{key}_total", 0)) for key in ("prefill", "sample", "train")}


def finish(run: Run) -> RunSummary:
    """The before/after table and the token account, printed; what the run produced."""
    state = run.state
    table = None
    if len(state.evaluations) >= 2:
        table = write_eval_table(run.run_dir, state.evaluations[0], state.evaluations[-1])
        print(table)
    totals = totals_of(state.history)
    cost = TokenCost(totals["prefill"], totals["sample"], totals["train"], run.config.prices)
    print(cost_summary(cost))
    final_adapter = None
    if state.adapter_version > 0:
        final_adapter = run.run_dir / "adapters" / f"v{state.adapter_version}"
    return RunSummary(
        run_dir=run.run_dir,
        steps=state.step,
        adapter_dir=final_adapter,
        adapter_version=state.adapter_version,
        evaluations=state.evaluations,
        cost=cost,
        history=state.history,
        eval_table=table,
    )
