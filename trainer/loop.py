"""``train(config)``: the GRPO loop, top to bottom; :func:`run_step` is one step.

A step samples its rollouts, groups them by row, turns each group's rewards into advantages, updates
the adapter and publishes the new version (:mod:`trainer.batch`, :mod:`trainer.update`); the run's
setup and teardown (policy server, learner, checkpoints, metrics) are in :mod:`trainer.run`.

Determinism: every rollout's payload carries its own sampling seed (``inferenceParams.seed``, derived
from the config seed, the step, the group and the member), which an agent passes to its model calls;
the hf and vLLM engines seed each request from it, so what a rollout samples does not depend on
which other rollouts happen to share its batch. Data order comes from the config seed and the epoch;
dropout from the config seed and the step. Together with checkpoints of the optimizer and the data
position, a run killed at any point and resumed ends with the same adapter as one never stopped.

Rollouts play on their own event loop (:mod:`trainer.rollouts.producer`);
:mod:`trainer.rollouts.pipeline` decides when each step's rollouts start and on which adapter: right
before the step (synchronous, the default) or up to ``max_off_policy_steps`` steps ahead, while the
learner trains (asynchronous).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import wait
from pathlib import Path
from typing import Any

from trainer.batch import assign_advantages, group_rollouts
from trainer.config import TrainConfig
from trainer.distill import distill_sequences
from trainer.engine import check_model
from trainer.errors import TrainingError
from trainer.fidelity import check_fidelity
from trainer.learner.checkpoint import CheckpointWriteError, checkpoint_name, save_checkpoint
from trainer.ops.preemption import Preemption, RunPreempted
from trainer.ops.stacks import stacks_on_demand
from trainer.ops.watchdog import StallWatchdog
from trainer.record import Sampled, check_failures, failed_postfix, step_record
from trainer.rollouts.evaluation import EvalResult
from trainer.rollouts.fanout import check_agents_listen
from trainer.rollouts.pipeline import adapter_dirs
from trainer.run import (
    EvaluationHook,
    Run,
    RunSummary,
    add_log_file,
    close_learner,
    evaluate_run,
    finish,
    logged_stop,
    open_run,
    serve_start_adapter,
    totals_of,
)
from trainer.update import publish, update_policy

log = logging.getLogger(__name__)


def train(
    config: TrainConfig, *, resume: bool = False, on_evaluation: EvaluationHook | None = None
) -> RunSummary:
    """Run GRPO as ``config`` says; with ``resume``, continue from the newest checkpoint.

    The run's log also goes to ``output_dir/train.log``. ``on_evaluation``: see ``EvaluationHook``.
    SIGTERM stops the run at its next safe point with a checkpoint and raises :class:`RunPreempted`
    (``faults`` section; :mod:`trainer.ops.preemption`); SIGUSR1 writes every thread's stack to
    ``train.log`` (:mod:`trainer.ops.stacks`).
    """
    check_model(config)
    check_agents_listen(config.agents)  # before anything loads: the model, a Ray cluster
    config.output_dir.mkdir(parents=True, exist_ok=True)
    log_handler = add_log_file(config.output_dir)
    preemption = Preemption(config.faults, config.output_dir / "checkpoints").install()
    try:
        with stacks_on_demand(config.output_dir):
            if config.ray is None:
                return _train(config, resume, on_evaluation, preemption)
            # On Ray: a run whose learner worker dies restarts from its newest checkpoint.
            from trainer.learner.distributed import train_with_auto_resume
            from trainer.scale.ray_cluster import ray_cluster

            with ray_cluster(config.ray):
                return train_with_auto_resume(
                    config, resume, lambda config, resume: _train(config, resume, on_evaluation, preemption)
                )
    finally:
        preemption.restore()
        logging.getLogger("trainer").removeHandler(log_handler)
        log_handler.close()


def _train(
    config: TrainConfig, resume: bool, on_evaluation: EvaluationHook | None, preemption: Preemption
) -> RunSummary:
    run = open_run(config, resume)
    run.on_evaluation = on_evaluation
    failed = True
    watchdog = StallWatchdog(config.faults, run)
    try:
        run.session.start()
        watchdog.start()
        serve_start_adapter(run)
        if run.eval_rows and config.eval_on_start and not run.state.evaluations:
            evaluate_run(run, 0)
        run.totals = totals_of(run.state.history)
        _run_steps(run, preemption, watchdog)
        summary = finish(run)
        failed = False
        return summary
    finally:
        watchdog.stop()
        try:
            run.session.close()
        finally:
            close_learner(run.learner)
            run.metrics.close(failed=failed)


def _run_steps(run: Run, preemption: Preemption, watchdog: StallWatchdog) -> None:
    """The steps from where the run stands to the last; after a SIGTERM, up to the next safe point."""
    config = run.config
    # As a context manager the bar ends its line whatever ends the loop, so a message printed after
    # a Ctrl-C or a SIGTERM starts a line of its own.
    with _progress(config.max_steps, run.state.step) as progress:
        for step in range(run.state.step + 1, config.max_steps + 1):
            try:
                record = run_step(run, step, preemption, watchdog)
            except _StepAbandoned:
                raise _stopped(run, abandoned=True) from None
            progress.update(1)
            progress.set_postfix(
                reward=f"{record['reward_mean']:.3f}",
                groups_dropped=record["groups"]["dropped"],
                **failed_postfix(record),
            )
            if preemption.requested and step < config.max_steps:
                raise _stopped(run, abandoned=False)


class _StepAbandoned(Exception):
    """SIGTERM with ``faults.on_sigterm: abandon_step`` while the step's rollouts were playing."""


def _stopped(run: Run, *, abandoned: bool) -> RunPreempted:
    """The checkpoint a SIGTERM asks for (the one just saved after a step, or a new one holding the
    steps in flight), as the exception that ends the run."""
    if abandoned or not _checkpoint_due(run, run.state.step):
        checkpoint = _save_checkpoint(run)
    else:
        checkpoint = run.checkpoint_dir / checkpoint_name(run.state.step)
    stopped = RunPreempted(checkpoint, run.state.step + 1 if abandoned else run.state.step, abandoned)
    log.warning("SIGTERM: %s", stopped)
    return stopped


def run_step(
    run: Run, step: int, preemption: Preemption | None = None, watchdog: StallWatchdog | None = None
) -> dict[str, Any]:
    """One GRPO step: sample -> group -> advantages -> update -> publish; then maybe an evaluation,
    the step's record and a checkpoint."""
    started = time.monotonic()
    sampled = sample(run, step, preemption, watchdog)
    if run.transcripts is not None:
        run.transcripts.keep_step(step, sampled.played)
    batch = group_rollouts(sampled.played, sampled.num_groups)
    assign_advantages(run.config, batch)
    if run.teacher is not None and run.config.distillation is not None:
        batch.distillation = distill_sequences(run.teacher, run.config.distillation, batch.sequences)
    update = update_policy(run, step, batch)
    run.session.release(sampled.played)
    adapter_load_s = publish(run, step, update.applied)
    run.state.step = step
    record = step_record(run, sampled, batch, update, _evaluate_if_due(run, step))
    record["stalls"] = watchdog.take_stalls() if watchdog is not None else []
    record["time_s"] = {
        "rollout": sampled.seconds,
        "rollout_wait": sampled.wait_s,
        "update": update.seconds,
        "adapter_load": adapter_load_s,
        "step": time.monotonic() - started,
    }
    run.state.history.append({"step": step, **record})
    run.metrics.log_step(step, record)
    check_failures(step, sampled.played)
    check_fidelity(run.config.fidelity, step, record["fidelity"], run.parsers)
    _checkpoint_if_due(run, step)
    return record


def sample(
    run: Run, step: int, preemption: Preemption | None = None, watchdog: StallWatchdog | None = None
) -> Sampled:
    """The step's rollouts, played to the end.

    The rollouts of the next max_off_policy_steps steps are submitted first
    (:mod:`trainer.rollouts.pipeline`), so they play while this step's update runs. A SIGTERM that
    says abandon stops the wait (:class:`_StepAbandoned`); the step stays in flight for the checkpoint.
    A stall past ``faults.stall_timeout_s`` with ``on_stall_timeout: stop_run`` stops the run with the
    watchdog's diagnosis (a line of its own in metrics.jsonl).
    """
    started = time.monotonic()
    run.pipeline.fill(step, run.state.adapter_version, run.pick_rows)
    future = run.pipeline.pending[step].future
    while future is not None and not future.done():
        if preemption is not None and preemption.abandon:
            raise _StepAbandoned(step)
        if watchdog is not None and watchdog.fatal is not None:
            run.metrics.write_line(step, {"stalls": watchdog.take_stalls(), "stopped": watchdog.fatal})
            raise TrainingError(watchdog.fatal)
        wait([future], timeout=0.1)  # short, so the signal handler's flag is seen promptly
    rollouts = run.pipeline.take(step)
    played = rollouts.wait()
    wait_s = time.monotonic() - started
    staleness = run.pipeline.staleness(rollouts, run.state.adapter_version)
    return Sampled(played, len(rollouts.row_indices), rollouts.seconds, wait_s, staleness)


def _evaluate_if_due(run: Run, step: int) -> EvalResult | None:
    """An evaluation every eval_steps steps and (with eval_on_end) after the last one."""
    config = run.config
    periodic = config.eval_steps is not None and step % config.eval_steps == 0
    last = step == config.max_steps
    if run.eval_rows and (periodic or (last and config.eval_on_end)):
        return evaluate_run(run, step)
    return None


def _checkpoint_due(run: Run, step: int) -> bool:
    """A checkpoint every save_steps steps and after the last one."""
    return step % run.config.save_steps == 0 or step == run.config.max_steps


def _checkpoint_if_due(run: Run, step: int) -> None:
    if _checkpoint_due(run, step):
        _save_checkpoint(run)


def _save_checkpoint(run: Run) -> Path:
    """The run as it stands after ``run.state.step``, with the steps in flight and their adapters."""
    log.info("step %d: checkpoint started", run.state.step)
    try:
        path = save_checkpoint(
            run.checkpoint_dir,
            run.state,
            run.learner,
            keep=run.config.save_total_limit,
            in_flight=run.pipeline.snapshot(),
            pinned_adapters=adapter_dirs(run.run_dir, run.pipeline.pinned_versions()),
        )
    except CheckpointWriteError as error:
        raise logged_stop(error) from error.__cause__
    log.info("step %d: checkpoint saved", run.state.step)
    return path


def _progress(total: int, done: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc="rft train", unit="step", dynamic_ncols=True)
