"""``train(config)``: the GRPO loop, top to bottom.

The policy server (gateway + inference engine) runs in a background thread of this process; the
learner (transformers + peft) stays in the main thread. With the ``vllm`` engine, inference lives in
the vLLM server process and only the training model is here.

Determinism: every rollout's payload carries its own sampling seed (``inferenceParams.seed``, derived
from the config seed, the step, the group and the member), which an agent passes to its model calls;
the hf and vLLM engines seed each request from it, so what a rollout samples does not depend on
which other rollouts happen to share its batch. Data order comes from the config seed and the epoch;
dropout from the config seed and the step. Together with checkpoints of the optimizer and the data
position, a run killed at any point and resumed ends with the same adapter as one never stopped.

Rollouts play on their own event loop (:mod:`trainer.rollouts.producer`); :mod:`trainer.rollouts.pipeline` decides
when each step's rollouts start and on which adapter: right before the step (synchronous, the
default) or up to ``max_off_policy_steps`` steps ahead, while the learner trains (asynchronous).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from handlers.protocol import InferenceParams, RftkitExtras
from handlers.serving import ServingThread
from policy_server.engines.base import Engine
from policy_server.engines.vllm import VLLMEngine
from policy_server.gateway_pool import serve_gateway
from policy_server.image_store import ImageStore
from policy_server.jobs import Rejection
from policy_server.metrics import start_metrics_server
from policy_server.server import PolicyServer
from policy_server.sigv4_token import SageMakerTokenPolicy
from policy_server.trace import RolloutTrace, TokenCounters
from trainer.algo.grpo import group_advantages
from trainer.algo.sequences import TrainingSequence, build_sequences, count_train_tokens
from trainer.config import PolicyServerConfig, TrainConfig
from trainer.learner.checkpoint import (
    DataPosition,
    LoadedCheckpoint,
    RunState,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from trainer.learner.learner import Learner
from trainer.ops.metrics import MetricsLogger, TokenCost, cost_summary, write_eval_table
from trainer.ops.prometheus import StepExporter
from trainer.rollouts.dataset import PromptColumnError, select_prompts
from trainer.rollouts.evaluation import EvalResult, evaluate
from trainer.rollouts.fanout import (
    FailureCounts,
    Fanout,
    RolloutOutcome,
    RolloutRequest,
    group_is_trainable,
    mean_agent_metrics,
)
from trainer.rollouts.pipeline import RolloutPipeline, adapter_dirs
from trainer.rollouts.producer import PlayedRollout, RolloutProducer
from trainer.scale.placement import Placement, cuda_visible_devices
from trainer.scale.plan import preflight

if TYPE_CHECKING:
    from trainer.learner.distributed import RayLearner

log = logging.getLogger(__name__)

ADAPTERS_KEPT = 2  # the version being served and the one before it (calls may still be using it)
LOG_FILE = "train.log"


class TrainingError(RuntimeError):
    """The run cannot go on (bad data, nothing to resume from, an engine that will not start)."""


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


def derived_seed(*parts: object) -> int:
    """A 31-bit seed from the config seed and a position (step, group, member, ...): stable across runs."""
    digest = hashlib.sha256(":".join(str(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def read_rows(path: Path) -> list[Any]:
    """JSONL rows as they are (``select_prompts`` picks what of each goes to the agent)."""
    if not path.is_file():
        raise TrainingError(f"data file {path} does not exist")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise TrainingError(f"{path}:{number} is not JSON: {error}") from None
    if not rows:
        raise TrainingError(f"data file {path} holds no rows")
    return rows


def _prompts(rows: list[Any], column: str | None, path: Path) -> list[Any]:
    try:
        return select_prompts(rows, column, source=str(path))
    except PromptColumnError as error:
        raise TrainingError(str(error)) from None


def next_rows(
    rows: Sequence[Any], count: int, position: DataPosition, *, seed: int, shuffle: bool
) -> tuple[list[tuple[int, Any]], DataPosition]:
    """The next ``count`` rows (with their indices) and the position after them; epochs wrap."""
    picked: list[tuple[int, Any]] = []
    epoch, order, index = position.epoch, list(position.order), position.index
    while len(picked) < count:
        if not order or index >= len(order):
            if order:
                epoch += 1
            order = list(range(len(rows)))
            if shuffle:
                random.Random(derived_seed(seed, "epoch", epoch)).shuffle(order)
            index = 0
        picked.append((order[index], rows[order[index]]))
        index += 1
    return picked, DataPosition(epoch=epoch, order=order, index=index)


def build_engine(config: TrainConfig, model_dir: Path, placement: Placement) -> Engine:
    if config.ray is not None:
        from trainer.scale.ray_cluster import ray_engine

        # Named after the run, so `ray list actors` shows whose replicas these are.
        return ray_engine(
            config, model_dir, name_prefix=f"rftkit-{config.output_dir.name}-{uuid.uuid4().hex[:8]}"
        )
    if config.engine == "vllm":
        vllm = config.vllm
        return VLLMEngine(
            model_dir,
            python=str(vllm.python) if vllm.python else None,
            base_url=vllm.attach_url,
            served_name=config.policy_name,
            max_lora_rank=vllm.max_lora_rank,
            max_loras=vllm.max_loras,
            dtype=vllm.dtype,
            max_model_len=vllm.max_model_len,
            tensor_parallel_size=vllm.tensor_parallel_size,
            gpu_memory_utilization=vllm.gpu_memory_utilization,
            enable_sleep_mode=vllm.enable_sleep_mode,
            cuda_visible_devices=cuda_visible_devices(placement.vllm_devices)
            if placement.vllm_devices
            else None,
            extra_args=vllm.extra_args,
            startup_timeout_s=vllm.startup_timeout_s,
            tool_call_parser=vllm.tool_call_parser,
            reasoning_parser=vllm.reasoning_parser,
            chat_template=config.chat_template,
            image_limits=config.policy_server.image_limits(),
        )
    from policy_server.engines.hf import HFEngine

    return HFEngine(
        model_dir,
        max_batch_size=config.hf.max_batch_size,
        device=placement.engine_device,
        dtype=getattr(torch, placement.engine_dtype),
        seed=config.seed,
        batch_invariant=config.hf.batch_invariant,
        chat_template=config.chat_template,
    )


def _engine_asleep(run: _Run, asleep: bool) -> None:
    """vLLM's sleep mode: hand its GPU memory to the learner for the update, then take it back."""
    config, engine = run.config, run.session.server.engine
    if config.engine != "vllm" or not config.vllm.enable_sleep_mode:
        return
    assert isinstance(engine, VLLMEngine)
    run.session.thread.run(engine.sleep(config.vllm.sleep_level) if asleep else engine.wake_up())


def _model_dir(config: TrainConfig, run_dir: Path) -> Path:
    if config.model is not None:
        return Path(config.model)
    from policy_server.tiny_model import build_tiny_model

    target = run_dir / "tiny-model"
    if (target / "config.json").is_file():
        return target
    return build_tiny_model(target, seed=config.seed)


def sagemaker_token_policy(config: PolicyServerConfig) -> SageMakerTokenPolicy | None:
    """The gateway's SageMaker-token policy, when the config accepts such tokens."""
    if not config.accept_sagemaker_tokens:
        return None
    return SageMakerTokenPolicy(access_key_ids=frozenset(config.sagemaker_access_key_ids))


class _Session:
    """The policy server, the fan-out and one job: plays rollouts and hands back their traces."""

    def __init__(self, config: TrainConfig, engine: Engine, images: ImageStore | None = None) -> None:
        self.config = config
        self.server = PolicyServer(
            engine,
            policy_name=config.policy_name,
            api_key=config.policy_server.api_key,
            sagemaker_tokens=sagemaker_token_policy(config.policy_server),
            image_limits=config.policy_server.image_limits(),
            image_store=images,
        )
        self.thread = serve_gateway(
            self.server,
            config.policy_server.host,
            config.policy_server.port,
            workers=config.policy_server.gateway_workers,
        )
        self.job_arn = f"rftkit-{config.output_dir.name}-{uuid.uuid4().hex[:12]}"
        # Rollouts play on their own event loop, so they can run while the learner trains.
        self.producer = RolloutProducer(
            self.server, Fanout.from_config(config), self.job_arn, config.reward_aggregation
        )
        # What agents get: the agents' key only. The trainer's own operations (jobs, traces,
        # adapters) are method calls on self.server, never served to agents over HTTP.
        self.extras = RftkitExtras(
            model=config.policy_name,
            api_key=config.policy_server.api_key,
            timeout_s=config.rollout_timeout_s,
        )
        self.endpoint = ""
        # Tokens of the evaluations since the last step (what asynchronous steps count them from).
        self.eval_tokens = TokenCounters()
        self.metrics_thread: ServingThread | None = None

    def start(self) -> None:
        self.thread.start()
        self.producer.start()
        settings = self.config.policy_server
        if settings.metrics_port is not None:
            self.metrics_thread = start_metrics_server(
                self.server.metrics, settings.host, settings.metrics_port
            )
            log.info("Prometheus metrics at %s/metrics", self.metrics_thread.url)
        self.endpoint = self.config.policy_server.public_url or self.thread.url
        self.server.open_job(
            self.job_arn,
            max_tokens=self.config.max_completion_length,
            max_calls_per_rollout=self.config.max_calls_per_rollout,
        )

    def close(self) -> None:
        """Close the job (if open), the fan-out and the server."""
        if self.endpoint:
            try:
                self.server.close_job(self.job_arn)
            except Rejection as rejection:  # closed already: nothing is lost, and close() must finish
                log.warning("closing job %s: %s", self.job_arn, rejection.message)
        try:
            self.producer.close()
        finally:
            if self.metrics_thread is not None:
                self.metrics_thread.stop()
            self.thread.stop()

    def request(
        self, row: Any, rollout_id: str, group_index: int, *, temperature: float, seed: int
    ) -> RolloutRequest:
        params = InferenceParams(
            temperature=temperature,
            max_tokens=self.config.max_completion_length,
            top_p=self.config.top_p,
            seed=seed,
        )
        return RolloutRequest(
            row=row,
            rollout_id=rollout_id,
            group_index=group_index,
            job_arn=self.job_arn,
            endpoint=self.endpoint,
            inference_params=params,
            extras=self.extras,
        )

    def play(self, requests: list[RolloutRequest]) -> list[PlayedRollout]:
        """Register, dispatch and collect ``requests``; rewards from the answer or from update-reward."""
        return self.producer.play(requests)

    def count_eval_tokens(self, played: list[PlayedRollout]) -> None:
        """Add evaluation rollouts' tokens to ``eval_tokens``."""
        calls = [call for rollout in played for call in rollout.trace.calls]
        self.eval_tokens.prefill_tokens += sum(len(call.prompt_token_ids) for call in calls)
        self.eval_tokens.sample_tokens += sum(len(call.completion_token_ids) for call in calls)

    def release(self, played: list[PlayedRollout]) -> None:
        """Done with these rollouts' traces: their images leave the run's image store."""
        for rollout in played:
            self.server.release_trace(rollout.trace)

    def load_adapter(self, directory: Path) -> int:
        return self.thread.run(self.server.load_adapter(directory))


@dataclass
class _GroupBatch:
    """A step's training sequences and what was dropped on the way."""

    sequences: list[TrainingSequence] = field(default_factory=list)
    traces: list[RolloutTrace] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    dropped_groups: int = 0
    bad_traces: int = 0


def _collect(config: TrainConfig, played: list[PlayedRollout], num_groups: int) -> _GroupBatch:
    """Advantages per group (failed rollouts left out, untrainable groups skipped), then sequences."""
    batch = _GroupBatch()
    groups: list[list[tuple[PlayedRollout, list[TrainingSequence]]]] = [[] for _ in range(num_groups)]
    failed: list[list[RolloutOutcome]] = [[] for _ in range(num_groups)]
    for rollout in played:
        if not rollout.outcome.ok or rollout.outcome.reward is None:
            failed[rollout.request.group_index].append(rollout.outcome)
            continue  # failed: out of the group's statistics, never a zero
        batch.rewards.append(rollout.outcome.reward)
        try:
            sequences = build_sequences(rollout.trace)
        except ValueError as error:
            batch.bad_traces += 1
            log.warning("rollout %s dropped: %s", rollout.request.rollout_id, error)
            continue
        groups[rollout.request.group_index].append((rollout, sequences))
    centred_groups = []
    for index, members in enumerate(groups):
        check = group_is_trainable([rollout.outcome for rollout, _ in members] + failed[index])
        if not check:
            batch.dropped_groups += 1
            log.info("group %d gives no gradient: %s", index, check.reason)
            continue
        rewards = torch.tensor([rollout.outcome.reward for rollout, _ in members], dtype=torch.float64)
        advantages = group_advantages(rewards, scale_by_std=config.scale_rewards == "group")
        centred_groups.append((members, advantages))
    if config.scale_rewards == "batch" and centred_groups:
        all_rewards = torch.tensor(
            [rollout.outcome.reward for members, _ in centred_groups for rollout, _ in members],
            dtype=torch.float64,
        )
        scale = float(all_rewards.std()) + 1e-6
        centred_groups = [(members, advantages / scale) for members, advantages in centred_groups]
    for members, advantages in centred_groups:
        for (rollout, sequences), advantage in zip(members, advantages.tolist(), strict=True):
            for sequence in sequences:
                sequence.advantage = advantage
            batch.sequences += sequences
            batch.traces.append(rollout.trace)
    return batch


def _step_record(
    config: TrainConfig,
    played: list[PlayedRollout],
    batch: _GroupBatch,
    tokens: dict[str, int],
    totals: dict[str, int],
    rollout_s: float,
) -> dict[str, Any]:
    """Rewards, rollouts, failures by cause, dropped groups, tokens and dollars of one step."""
    failures = FailureCounts()
    failures.add(rollout.outcome for rollout in played)
    rewards = batch.rewards
    token_counts = count_train_tokens(batch.traces)
    return {
        "reward_mean": math.fsum(rewards) / len(rewards) if rewards else float("nan"),
        "reward_std": float(torch.tensor(rewards).std()) if len(rewards) > 1 else 0.0,
        "success_rate": (
            sum(reward > config.success_threshold for reward in rewards) / len(rewards)
            if rewards
            else float("nan")
        ),
        "rollouts": {
            "total": len(played),
            "ok": sum(rollout.outcome.ok for rollout in played),
            "failed": failures.total,
            "bad_trace": batch.bad_traces,
            "per_s": len(played) / rollout_s if rollout_s > 0 else 0.0,
        },
        "failures": failures.as_dict(),
        "failure_errors": failures.errors_dict(),
        "agent_metrics": mean_agent_metrics([rollout.outcome for rollout in played]),
        "groups": {
            "total": len({rollout.request.group_index for rollout in played}),
            "dropped": batch.dropped_groups,
        },
        # Versions as the policy server numbered them (its numbering restarts on resume).
        "sampled_adapter_versions": sorted(
            {call.adapter_version for rollout in played for call in rollout.trace.calls}
        ),
        "tokens": {
            **tokens,
            "train_per_call": token_counts.per_call,
            "merge_ratio": token_counts.ratio,
            **{f"{key}_total": value for key, value in totals.items()},
        },
        "cost_usd_total": TokenCost(
            totals["prefill"], totals["sample"], totals["train"], config.prices
        ).dollars,
    }


def _save_version(
    learner: Learner | RayLearner, run_dir: Path, version: int, keep: int = ADAPTERS_KEPT
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


def _add_log_file(run_dir: Path) -> logging.Handler:
    handler = logging.FileHandler(run_dir / LOG_FILE)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("trainer").addHandler(handler)
    logging.getLogger("trainer").setLevel(logging.INFO)
    return handler


def _totals(history: list[dict[str, Any]]) -> dict[str, int]:
    last = history[-1]["tokens"] if history else {}
    return {key: int(last.get(f"{key}_total", 0)) for key in ("prefill", "sample", "train")}


# Called after every evaluation with its step, the played rollouts (traces included) and the run's
# metrics logger: how a caller shows what the policy did (``rft demo``'s episode gallery).
EvaluationHook = Callable[[int, list[PlayedRollout], MetricsLogger], None]


def train(
    config: TrainConfig, *, resume: bool = False, on_evaluation: EvaluationHook | None = None
) -> RunSummary:
    """Run GRPO as ``config`` says; with ``resume``, continue from the newest checkpoint.

    The run's log also goes to ``output_dir/train.log``. ``on_evaluation``: see ``EvaluationHook``.
    """
    config.output_dir.mkdir(parents=True, exist_ok=True)
    log_handler = _add_log_file(config.output_dir)
    try:
        if config.ray is None:
            return _train(config, resume, on_evaluation)
        # On Ray: a run whose learner worker dies restarts from its newest checkpoint.
        from trainer.learner.distributed import train_with_auto_resume
        from trainer.scale.ray_cluster import ray_cluster

        with ray_cluster(config.ray):
            return train_with_auto_resume(
                config, resume, lambda config, resume: _train(config, resume, on_evaluation)
            )
    finally:
        logging.getLogger("trainer").removeHandler(log_handler)
        log_handler.close()


@dataclass
class _Run:
    """What every step of one run shares: its data, learner, bookkeeping, metrics and policy server."""

    config: TrainConfig
    train_rows: list[Any]
    eval_rows: list[Any]
    learner: Learner | RayLearner
    state: RunState
    resumed_from: Path | None
    metrics: MetricsLogger
    session: _Session
    pipeline: RolloutPipeline
    loaded: LoadedCheckpoint | None = None
    totals: dict[str, int] = field(default_factory=dict)
    counted: TokenCounters = field(default_factory=TokenCounters)  # the server's counters at the last step
    on_evaluation: EvaluationHook | None = None

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


@dataclass
class _StepUpdate:
    """What the optimizer did with one step's batch."""

    applied: bool
    metrics: dict[str, float]
    seconds: float


def _train(config: TrainConfig, resume: bool, on_evaluation: EvaluationHook | None) -> RunSummary:
    run = _open_run(config, resume)
    run.on_evaluation = on_evaluation
    failed = True
    try:
        run.session.start()
        _serve_start_adapter(run)
        if run.eval_rows and config.eval_on_start and not run.state.evaluations:
            _evaluate(run, 0)
        run.totals = _totals(run.state.history)
        progress = _progress(config.max_steps, run.state.step)
        for step in range(run.state.step + 1, config.max_steps + 1):
            record = _run_step(run, step)
            progress.update(1)
            progress.set_postfix(
                reward=f"{record['reward_mean']:.3f}", groups_dropped=record["groups"]["dropped"]
            )
        progress.close()
        summary = _finish(run)
        failed = False
        return summary
    finally:
        try:
            run.session.close()
        finally:
            run.metrics.close(failed=failed)


def _open_run(config: TrainConfig, resume: bool) -> _Run:
    """Rows, the learner (restored on resume), the metrics logger and the (not yet started) server."""
    run_dir = config.output_dir
    checkpoint_dir = run_dir / "checkpoints"
    if not resume and latest_checkpoint(checkpoint_dir) is not None:
        raise TrainingError(
            f"{run_dir} already holds a run (checkpoints in {checkpoint_dir}): pass --resume to continue "
            "it, or choose another output_dir"
        )
    train_rows = _prompts(read_rows(config.train_file), config.prompt_column, config.train_file)
    eval_rows = []
    if config.eval_file is not None:
        eval_rows = _prompts(read_rows(config.eval_file), config.prompt_column, config.eval_file)
    eval_rows = eval_rows[: config.max_eval_rows] if config.max_eval_rows else eval_rows
    model_dir = _model_dir(config, run_dir)

    # The memory plan (refuses a config that cannot fit), the learner, and where the run stands.
    placement = preflight(config, model_dir)
    # Images of the calls being trained on, once each, until the update is done with their traces.
    images = ImageStore(run_dir / "images")
    learner: Learner | RayLearner
    if config.ray is None:
        learner = Learner(model_dir, config, placement=placement, image_store=images)
    else:
        from trainer.learner.distributed import RayLearner

        learner = RayLearner(model_dir, config, placement=placement)
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
        metrics.log_params(config.model_dump(mode="json", exclude={"policy_server": {"api_key"}}))
    session = _Session(config, build_engine(config, model_dir, placement), images)
    metrics.sinks.append(StepExporter(session.server.metrics.registry).publish)
    pipeline = RolloutPipeline(
        session.producer,
        max_off_policy_steps=config.max_off_policy_steps,
        max_steps=config.max_steps,
        make_requests=lambda step, rows: _step_requests(config, session, step, rows),
    )
    return _Run(
        config, train_rows, eval_rows, learner, state, resumed_from, metrics, session, pipeline, loaded
    )


def _serve_start_adapter(run: _Run) -> None:
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
                pipeline.served(version, run.session.load_adapter(directories[version]))
            steps = [saved for saved in loaded.in_flight if saved["adapter_version"] == version]
            pipeline.resume(steps, run.train_rows)
    elif run.config.init_adapter is not None:
        # The warm-start adapter is version 1: the first evaluation and step sample with it.
        state.adapter_version = 1
        directory = _save_version(run.learner, run.run_dir, state.adapter_version, run.adapters_kept)
        pipeline.served(state.adapter_version, run.session.load_adapter(directory))


def _evaluate(run: _Run, step: int) -> EvalResult:
    """Play the evaluation rows with the current adapter and keep the result in the run's state."""
    config, session = run.config, run.session
    played: list[PlayedRollout] = []

    def play(requests: list[RolloutRequest]) -> list[RolloutOutcome]:
        batch = session.play(requests)
        played.extend(batch)
        session.count_eval_tokens(batch)
        return [rollout.outcome for rollout in batch]

    try:
        result = evaluate(
            run.eval_rows,
            step=step,
            make_request=lambda index, row, generation: session.request(
                row,
                f"eval-{step}-{index}-{generation}-{uuid.uuid4().hex[:8]}",
                index,
                temperature=config.eval_temperature,
                # The same seeds at every evaluation: before and after sample with the same random
                # numbers, so their difference is the policy's, not the dice's.
                seed=derived_seed(config.seed, "eval", index, generation),
            ),
            play=play,
            success_threshold=config.success_threshold,
            adapter_version=run.state.adapter_version,
            generations=config.eval_generations,
        )
        if run.on_evaluation is not None:
            run.on_evaluation(step, played, run.metrics)
    finally:
        session.release(played)
    _record_evaluation(run, step, result)
    return result


def _record_evaluation(run: _Run, step: int, result: EvalResult) -> None:
    """Keep the result in the run's state; warn about failed rollouts, stop when none was scored."""
    run.state.evaluations.append(result.as_dict())
    if result.failed:
        failures = "; ".join(
            f"{cause} x{count}, first: {result.failure_errors.get(cause, '')}"
            for cause, count in result.failures.items()
        )
        if not result.scored:
            raise TrainingError(
                f"evaluation at step {step}: all {result.failed} rollouts failed: {failures}. "
                "The agents' own logs have the details."
            )
        log.warning("eval at step %d: %d rollouts failed: %s", step, result.failed, failures)
    log.info("eval at step %d: success %.3f, mean reward %.4f", step, result.success_rate, result.mean_reward)


def _run_step(run: _Run, step: int) -> dict[str, Any]:
    """One GRPO step: rollouts, update, new adapter version, maybe an evaluation, record, checkpoint.

    The rollouts of the next max_off_policy_steps steps are submitted first (:mod:`trainer.rollouts.pipeline`),
    so they play while this step's update runs.
    """
    config, state = run.config, run.state
    step_started = time.monotonic()
    run.pipeline.fill(step, state.adapter_version, run.pick_rows)
    rollouts = run.pipeline.take(step)
    played = rollouts.wait()
    rollout_wait_s = time.monotonic() - step_started
    rollout_s = rollouts.seconds
    staleness = run.pipeline.staleness(rollouts, state.adapter_version)

    batch = _collect(config, played, len(rollouts.row_indices))
    update = _update(run, step, batch)
    run.session.release(played)
    adapter_load_s = _publish(run, step, update.applied)
    state.step = step
    last = step == config.max_steps
    periodic = config.eval_steps is not None and step % config.eval_steps == 0
    evaluation = None
    if run.eval_rows and (periodic or (last and config.eval_on_end)):
        evaluation = _evaluate(run, step)

    record = _step_record(config, played, batch, _count_tokens(run, update, played), run.totals, rollout_s)
    record["update"] = {"applied": update.applied, **update.metrics}
    record["adapter_version"] = state.adapter_version
    record["staleness"] = staleness
    replica_stats = getattr(run.session.server.engine, "replica_stats", None)
    if replica_stats is not None:  # inference replicas on Ray: calls per replica, failovers, restarts
        record["replicas"] = replica_stats()
    if evaluation is not None:
        record["eval"] = evaluation.as_dict()
    record["time_s"] = {
        "rollout": rollout_s,
        "rollout_wait": rollout_wait_s,
        "update": update.seconds,
        "adapter_load": adapter_load_s,
        "step": time.monotonic() - step_started,
    }
    state.history.append({"step": step, **record})
    run.metrics.log_step(step, record)
    _check_failures(step, played)
    if step % config.save_steps == 0 or last:
        save_checkpoint(
            run.checkpoint_dir,
            state,
            run.learner,
            keep=config.save_total_limit,
            in_flight=run.pipeline.snapshot(),
            pinned_adapters=adapter_dirs(run.run_dir, run.pipeline.pinned_versions()),
        )
        log.info("step %d: checkpoint saved", step)
    return record


def _check_failures(step: int, played: list[PlayedRollout]) -> None:
    """Show failed rollouts' causes with their first error text; stop a run whose rollouts all failed."""
    failures = FailureCounts()
    failures.add(rollout.outcome for rollout in played)
    if not failures.total:
        return
    if failures.total == len(played):
        raise TrainingError(
            f"step {step}: all {len(played)} rollouts failed, so there is nothing to train on: "
            f"{failures.describe()}. The agents' own logs have the details."
        )
    log.warning(
        "step %d: %d of %d rollouts failed: %s", step, failures.total, len(played), failures.describe()
    )


def _step_requests(
    config: TrainConfig, session: _Session, step: int, rows: list[Any]
) -> list[RolloutRequest]:
    """G rollouts per row, each with a fresh id and its own sampling seed."""
    return [
        session.request(
            row,
            f"s{step}-g{group}-{member}-{uuid.uuid4().hex[:8]}",
            group,
            temperature=config.temperature,
            seed=derived_seed(config.seed, "train", step, group, member),
        )
        for group, row in enumerate(rows)
        for member in range(config.num_generations)
    ]


def _update(run: _Run, step: int, batch: _GroupBatch) -> _StepUpdate:
    """``num_iterations`` optimizer steps on the batch.

    With the sampler/learner correction on and several passes, the learner's logprobs of the batch
    are taken once before the first pass: the fixed old policy every pass is clipped against (as
    TRL's). The first pass's metrics describe the batch against the policy that sampled it (mismatch
    KL, importance ratios); the last pass's clip fraction shows how far the later passes went.
    """
    started = time.monotonic()
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
        return _StepUpdate(applied, metrics, time.monotonic() - started)
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
    return _StepUpdate(applied, metrics, time.monotonic() - started)


def _publish(run: _Run, step: int, updated: bool) -> float:
    """Save and serve a new adapter version (used from the next step on); the seconds it took."""
    started = time.monotonic()
    if updated:
        run.state.adapter_version += 1
        directory = _save_version(run.learner, run.run_dir, run.state.adapter_version, run.adapters_kept)
        served = run.session.load_adapter(directory)
        run.pipeline.served(run.state.adapter_version, served)
        log.info("step %d: adapter v%d served as version %d", step, run.state.adapter_version, served)
    return time.monotonic() - started


def _count_tokens(run: _Run, update: _StepUpdate, played: list[PlayedRollout]) -> dict[str, int]:
    """The step's prefill and sample tokens (evaluations included) and train tokens; totals move on.

    Synchronous: what the server counted since the last step. Asynchronous: the server meanwhile also
    sampled for later steps, as far as timing let it, so the step's own rollouts' traces are counted
    (and the evaluations' since the last step), which a repeated run counts the same.
    """
    counters = run.session.server.counters(run.session.job_arn)
    if run.config.max_off_policy_steps == 0:
        prefill = counters.prefill_tokens - run.counted.prefill_tokens
        sample = counters.sample_tokens - run.counted.sample_tokens
    else:
        evaluated, run.session.eval_tokens = run.session.eval_tokens, TokenCounters()
        prefill = evaluated.prefill_tokens + sum(
            len(c.prompt_token_ids) for r in played for c in r.trace.calls
        )
        sample = evaluated.sample_tokens + sum(
            len(c.completion_token_ids) for r in played for c in r.trace.calls
        )
    tokens = {"prefill": prefill, "sample": sample, "train": int(update.metrics.get("train_tokens", 0))}
    run.counted = counters
    run.totals = {key: run.totals[key] + tokens[key] for key in run.totals}
    return tokens


def _finish(run: _Run) -> RunSummary:
    """The before/after table and the token account, printed; what the run produced."""
    state = run.state
    table = None
    if len(state.evaluations) >= 2:
        table = write_eval_table(run.run_dir, state.evaluations[0], state.evaluations[-1])
        print(table)
    totals = _totals(state.history)
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


def _progress(total: int, done: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc="rft train", unit="step", dynamic_ncols=True)
