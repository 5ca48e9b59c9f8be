"""The update half of a GRPO step: optimizer passes on the step's batch, then the new adapter served."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from policy_server.engines import VLLMEngine
from trainer.batch import StepBatch
from trainer.rollouts.dataset import derived_seed
from trainer.run import Run, save_version

log = logging.getLogger(__name__)


@dataclass
class StepUpdate:
    """What the optimizer did with one step's batch."""

    applied: bool
    metrics: dict[str, float]
    seconds: float


def _engine_asleep(run: Run, asleep: bool) -> None:
    """vLLM's sleep mode: hand its GPU memory to the learner for the update, then take it back."""
    config, engine = run.config, run.session.server.engine
    if config.engine != "vllm" or not config.vllm.enable_sleep_mode:
        return
    assert isinstance(engine, VLLMEngine)
    run.session.thread.run(engine.sleep(config.vllm.sleep_level) if asleep else engine.wake_up())


def update_policy(run: Run, step: int, batch: StepBatch) -> StepUpdate:
    """``num_iterations`` optimizer steps on the batch.

    With the sampler/learner correction on and several passes, the learner's logprobs of the batch
    are taken once before the first pass: the fixed old policy every pass is clipped against (as
    TRL's). The first pass's metrics describe the batch against the policy that sampled it (mismatch
    KL, importance ratios); the last pass's clip fraction shows how far the later passes went.
    """
    started = time.monotonic()
    log.info("step %d: update started", step)
    metrics: dict[str, float] = {}
    applied = False
    sequences = run.learner.scorable(batch.sequences)
    if len(sequences) < len(batch.sequences):
        log.warning(
            "step %d: %d sequence(s) sampled an image placeholder token and stay out of the update",
            step,
            len(batch.sequences) - len(sequences),
        )
    batch.sequences = sequences
    if not batch.sequences:
        log.info("step %d: no trainable group, no update", step)
        return StepUpdate(applied, metrics, time.monotonic() - started)
    _engine_asleep(run, True)
    try:
        config = run.config
        old_logprobs = None
        if config.vllm_importance_sampling_correction and config.num_iterations > 1:
            old_logprobs = run.learner.old_logprobs(batch.sequences)
        for iteration in range(config.num_iterations):
            seed = derived_seed(config.seed, "update", step, iteration)
            result = run.learner.train_step(batch.sequences, seed=seed, old_logprobs=old_logprobs)
            applied = applied or not result.skipped
            if iteration == 0:
                metrics = dict(result.metrics)
    finally:
        _engine_asleep(run, False)
    metrics["clip_fraction_last"] = result.metrics.get("clip_fraction", 0.0)
    return StepUpdate(applied, metrics, time.monotonic() - started)


def publish(run: Run, step: int, updated: bool) -> float:
    """Save and serve a new adapter version (used from the next step on); the seconds it took."""
    started = time.monotonic()
    if updated:
        run.state.adapter_version += 1
        log.info("step %d: publishing adapter v%d", step, run.state.adapter_version)
        directory = save_version(run.learner, run.run_dir, run.state.adapter_version, run.adapters_kept)
        version = run.state.adapter_version
        run.session.load_adapter(directory, version)
        log.info("step %d: adapter v%d served", step, version)
    return time.monotonic() - started
