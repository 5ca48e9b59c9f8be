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
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import random
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from handlers.protocol import InferenceParams, RftkitExtras
from policy_server.engines.base import Engine
from policy_server.running import ServerThread
from policy_server.server import PolicyServer
from policy_server.trace import RolloutTrace, TokenCounters
from trainer.checkpoint import DataPosition, RunState, latest_checkpoint, load_checkpoint, save_checkpoint
from trainer.config import TrainConfig
from trainer.evaluation import EvalResult, evaluate
from trainer.fanout import (
    FailureCounts,
    Fanout,
    RolloutOutcome,
    RolloutRequest,
    group_is_trainable,
    mean_agent_metrics,
    resolve_reward,
)
from trainer.grpo import group_advantages
from trainer.learner import Learner, learner_from_config
from trainer.metrics import MetricsLogger, TokenCost, cost_summary, write_eval_table
from trainer.sequences import TrainingSequence, build_sequences, count_train_tokens

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


@dataclass
class PlayedRollout:
    request: RolloutRequest
    outcome: RolloutOutcome
    trace: RolloutTrace


def derived_seed(*parts: object) -> int:
    """A 31-bit seed from the config seed and a position (step, group, member, ...): stable across runs."""
    digest = hashlib.sha256(":".join(str(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def read_rows(path: Path) -> list[Any]:
    """JSONL rows, each passed to the agent's ``prompt`` as it is."""
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


def build_engine(config: TrainConfig, model_dir: Path) -> Engine:
    if config.engine == "vllm":
        from policy_server.engines.vllm import VLLMEngine

        return VLLMEngine(
            model_dir,
            python=str(config.vllm.python) if config.vllm.python else None,
            base_url=config.vllm.attach_url,
            served_name=config.policy_name,
            max_lora_rank=config.vllm.max_lora_rank,
            max_loras=config.vllm.max_loras,
            dtype=config.vllm.dtype,
            extra_args=config.vllm.extra_args,
            startup_timeout_s=config.vllm.startup_timeout_s,
            tool_call_parser=config.vllm.tool_call_parser,
            reasoning_parser=config.vllm.reasoning_parser,
            chat_template=config.chat_template,
        )
    from policy_server.engines.hf import HFEngine

    return HFEngine(
        model_dir,
        max_batch_size=config.hf.max_batch_size,
        seed=config.seed,
        chat_template=config.chat_template,
    )


def _model_dir(config: TrainConfig, run_dir: Path) -> Path:
    if config.model is not None:
        return Path(config.model)
    from policy_server.tiny_model import build_tiny_model

    target = run_dir / "tiny-model"
    if (target / "config.json").is_file():
        return target
    return build_tiny_model(target, seed=config.seed)


class _Session:
    """The policy server, the fan-out and one job: plays rollouts and hands back their traces."""

    def __init__(self, config: TrainConfig, engine: Engine) -> None:
        self.config = config
        self.server = PolicyServer(
            engine, policy_name=config.policy_name, api_key=config.policy_server.api_key
        )
        self.thread = ServerThread(
            self.server, host=config.policy_server.host, port=config.policy_server.port
        )
        self.runner = asyncio.Runner()
        self.fanout = Fanout.from_config(config)
        self.job_arn = f"rftkit-{config.output_dir.name}-{uuid.uuid4().hex[:12]}"
        self.extras = RftkitExtras(model=config.policy_name, api_key=config.policy_server.api_key)
        self.endpoint = ""

    def start(self) -> None:
        self.thread.start()
        self.endpoint = self.config.policy_server.public_url or self.thread.url
        self.server.open_job(
            self.job_arn,
            max_tokens=self.config.max_completion_length,
            max_calls_per_rollout=self.config.max_calls_per_rollout,
        )

    def close(self) -> None:
        """Close the job (if open), the fan-out and the server."""
        if self.endpoint:
            self.server.close_job(self.job_arn)
        try:
            self.runner.run(self.fanout.aclose())
            self.runner.close()
        finally:
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
        for request in requests:
            self.server.open_rollout(self.job_arn, request.rollout_id)
        outcomes = self.runner.run(self.fanout.run(requests))
        played = []
        for request, outcome in zip(requests, outcomes, strict=True):
            trace = self.server.take_trace(self.job_arn, request.rollout_id)
            outcome = resolve_reward(outcome, trace.rewards, self.config.reward_aggregation)
            played.append(PlayedRollout(request, outcome, trace))
        return played

    def play_outcomes(self, requests: list[RolloutRequest]) -> list[RolloutOutcome]:
        return [rollout.outcome for rollout in self.play(requests)]

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
    for rollout in played:
        if not rollout.outcome.ok or rollout.outcome.reward is None:
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
        check = group_is_trainable([rollout.outcome for rollout, _ in members])
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
        "rollouts": {
            "total": len(played),
            "ok": sum(rollout.outcome.ok for rollout in played),
            "failed": failures.total,
            "bad_trace": batch.bad_traces,
            "per_s": len(played) / rollout_s if rollout_s > 0 else 0.0,
        },
        "failures": failures.as_dict(),
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


def _save_version(learner: Learner, run_dir: Path, version: int) -> Path:
    """A fresh directory per adapter version; older ones beyond ADAPTERS_KEPT are removed."""
    adapters = run_dir / "adapters"
    directory = adapters / f"v{version}"
    if directory.exists():  # left by a run that died before checkpointing this version
        shutil.rmtree(directory)
    learner.save_adapter(directory)
    for old in sorted(adapters.glob("v*"), key=lambda path: int(path.name[1:]))[:-ADAPTERS_KEPT]:
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


def train(config: TrainConfig, *, resume: bool = False) -> RunSummary:
    """Run GRPO as ``config`` says; with ``resume``, continue from the newest checkpoint.

    The run's log also goes to ``output_dir/train.log``.
    """
    config.output_dir.mkdir(parents=True, exist_ok=True)
    log_handler = _add_log_file(config.output_dir)
    try:
        return _train(config, resume)
    finally:
        logging.getLogger("trainer").removeHandler(log_handler)
        log_handler.close()


def _train(config: TrainConfig, resume: bool) -> RunSummary:
    run_dir = config.output_dir
    checkpoint_dir = run_dir / "checkpoints"
    if not resume and latest_checkpoint(checkpoint_dir) is not None:
        raise TrainingError(
            f"{run_dir} already holds a run (checkpoints in {checkpoint_dir}): pass --resume to continue "
            "it, or choose another output_dir"
        )
    train_rows = read_rows(config.train_file)
    eval_rows = read_rows(config.eval_file) if config.eval_file is not None else []
    eval_rows = eval_rows[: config.max_eval_rows] if config.max_eval_rows else eval_rows
    model_dir = _model_dir(config, run_dir)

    # The learner, and where the run stands.
    learner = learner_from_config(config, model_dir, init_adapter=config.init_adapter)
    state = RunState()
    resumed_from: Path | None = None
    if resume:
        resumed_from = latest_checkpoint(checkpoint_dir)
        if resumed_from is None:
            raise TrainingError(f"--resume: no checkpoint in {checkpoint_dir}; start without --resume")
        state = load_checkpoint(resumed_from, learner).state
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

    # The policy server with the current adapter, and one job for the whole run.
    session = _Session(config, build_engine(config, model_dir))
    failed = True
    try:
        session.start()
        if resumed_from is not None and state.adapter_version > 0:
            session.load_adapter(resumed_from / "adapter")
        elif resumed_from is None and config.init_adapter is not None:
            # The warm-start adapter is version 1: the first evaluation and step sample with it.
            state.adapter_version = 1
            session.load_adapter(_save_version(learner, run_dir, state.adapter_version))

        def run_eval(step: int) -> EvalResult:
            result = evaluate(
                eval_rows,
                step=step,
                make_request=lambda index, row, generation: session.request(
                    row,
                    f"eval-{step}-{index}-{generation}-{uuid.uuid4().hex[:8]}",
                    index,
                    temperature=config.eval_temperature,
                    # The same seeds at every evaluation: before and after sample with the same
                    # random numbers, so their difference is the policy's, not the dice's.
                    seed=derived_seed(config.seed, "eval", index, generation),
                ),
                play=session.play_outcomes,
                success_threshold=config.success_threshold,
                adapter_version=state.adapter_version,
                generations=config.eval_generations,
            )
            state.evaluations.append(result.as_dict())
            log.info(
                "eval at step %d: success %.3f, mean reward %.4f",
                step,
                result.success_rate,
                result.mean_reward,
            )
            return result

        if eval_rows and config.eval_on_start and not state.evaluations:
            run_eval(0)

        totals = _totals(state.history)
        counted = TokenCounters()  # the server's counters start at zero with the job
        progress = _progress(config.max_steps, state.step)
        for step in range(state.step + 1, config.max_steps + 1):
            step_started = time.monotonic()
            log.info("step %d: rollouts started", step)
            picked, state.position = next_rows(
                train_rows, config.rows_per_step, state.position, seed=config.seed, shuffle=config.shuffle
            )

            # G rollouts per row, each with a fresh id and its own sampling seed.
            requests = [
                session.request(
                    row,
                    f"s{step}-g{group}-{member}-{uuid.uuid4().hex[:8]}",
                    group,
                    temperature=config.temperature,
                    seed=derived_seed(config.seed, "train", step, group, member),
                )
                for group, (_, row) in enumerate(picked)
                for member in range(config.num_generations)
            ]
            played = session.play(requests)
            rollout_s = time.monotonic() - step_started

            # Advantages and sequences, then num_iterations optimizer steps on them. The first pass's
            # metrics describe the batch against the policy that sampled it (mismatch KL); the last
            # pass's clip fraction shows how far the later, off-policy passes went.
            batch = _collect(config, played, len(picked))
            update_started = time.monotonic()
            update_metrics: dict[str, float] = {}
            updated = False
            if batch.sequences:
                for iteration in range(config.num_iterations):
                    seed = derived_seed(config.seed, "update", step, iteration)
                    result = learner.train_step(batch.sequences, seed=seed)
                    updated = updated or not result.skipped
                    if iteration == 0:
                        update_metrics = dict(result.metrics)
                update_metrics["clip_fraction_last"] = result.metrics.get("clip_fraction", 0.0)
            else:
                log.info("step %d: no trainable group, no update", step)
            update_s = time.monotonic() - update_started

            # A new adapter version, served from the next step on.
            load_started = time.monotonic()
            if updated:
                state.adapter_version += 1
                directory = _save_version(learner, run_dir, state.adapter_version)
                served = session.load_adapter(directory)
                log.info("step %d: adapter v%d served as version %d", step, state.adapter_version, served)
            adapter_load_s = time.monotonic() - load_started
            state.step = step

            last = step == config.max_steps
            periodic = bool(config.eval_steps) and step % config.eval_steps == 0
            evaluation = None
            if eval_rows and (periodic or (last and config.eval_on_end)):
                evaluation = run_eval(step)

            # Prefill and sample tokens from the policy server, evaluation rollouts included.
            counters = session.server.counters(session.job_arn)
            tokens = {
                "prefill": counters.prefill_tokens - counted.prefill_tokens,
                "sample": counters.sample_tokens - counted.sample_tokens,
                "train": int(update_metrics.get("train_tokens", 0)),
            }
            counted = counters
            totals = {key: totals[key] + tokens[key] for key in totals}
            record = _step_record(config, played, batch, tokens, totals, rollout_s)
            record["update"] = {"applied": updated, **update_metrics}
            record["adapter_version"] = state.adapter_version
            if evaluation is not None:
                record["eval"] = evaluation.as_dict()
            record["time_s"] = {
                "rollout": rollout_s,
                "update": update_s,
                "adapter_load": adapter_load_s,
                "step": time.monotonic() - step_started,
            }
            state.history.append({"step": step, **record})
            metrics.log_step(step, record)
            progress.update(1)
            progress.set_postfix(reward=f"{record['reward_mean']:.3f}", groups_dropped=batch.dropped_groups)

            if step % config.save_steps == 0 or step == config.max_steps:
                save_checkpoint(checkpoint_dir, state, learner, keep=config.save_total_limit)
                log.info("step %d: checkpoint saved", step)
        progress.close()

        table = None
        if len(state.evaluations) >= 2:
            table = write_eval_table(run_dir, state.evaluations[0], state.evaluations[-1])
            print(table)
        totals = _totals(state.history)
        cost = TokenCost(totals["prefill"], totals["sample"], totals["train"], config.prices)
        print(cost_summary(cost))
        final_adapter = None
        if state.adapter_version > 0:
            final_adapter = run_dir / "adapters" / f"v{state.adapter_version}"
        failed = False
        return RunSummary(
            run_dir=run_dir,
            steps=state.step,
            adapter_dir=final_adapter,
            adapter_version=state.adapter_version,
            evaluations=state.evaluations,
            cost=cost,
            history=state.history,
            eval_table=table,
        )
    finally:
        try:
            session.close()
        finally:
            metrics.close(failed=failed)


def _progress(total: int, done: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc="rft train", unit="step", dynamic_ncols=True)
