"""The job and rollout registry: which jobs are open, their caps, each rollout's trace, token counters.

One registry serves the gateway's event loop and the trainer's thread at once, so every method takes
one lock; none of them awaits or does heavy work while holding it.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from handlers import JOB_NOT_FOUND_MESSAGE, RolloutStatus
from policy_server.errors import Rejection
from policy_server.trace import CallRecord, RolloutTrace, TokenCounters

# Finished rollout ids remembered per job, so that a late call answers "finished" instead of "unknown".
# Bounded so that a job running for days keeps flat memory; older ids fall back to "unknown" (still 4xx).
FINISHED_IDS_KEPT = 65_536
# A refusal's sentence kept in its rollout's trace (the first one only).
REFUSAL_TEXT_CHARS = 500


@dataclass(frozen=True)
class JobLimits:
    """Caps a job puts on every call of its rollouts."""

    max_tokens: int = 1024
    max_calls_per_rollout: int = 64
    auto_open_rollouts: bool = False
    # How many rollouts an auto-opening job holds at once: each one's trace stays until taken, and any
    # caller can name a fresh id, so without a cap one client could grow the server's memory for good.
    max_open_rollouts: int = 1024
    # An auto-opened rollout without a call or a report for this long is forgotten when its slot is
    # needed (nobody takes the traces of an open job's rollouts, so they would hold the cap for good).
    idle_rollout_s: float = 600.0
    # The reasoning_effort of every call that sends none (a run's reasoning_effort); None: none added.
    reasoning_effort: str | None = None


@dataclass
class _Rollout:
    trace: RolloutTrace
    calls_started: int = 0
    auto_opened: bool = False
    last_active: float = field(default_factory=time.monotonic)
    # (start sequence number, record): calls are ordered by when the gateway received them.
    records: list[tuple[int, CallRecord]] = field(default_factory=list)


@dataclass
class _Job:
    limits: JobLimits
    counters: TokenCounters = field(default_factory=TokenCounters)
    rollouts: dict[str, _Rollout] = field(default_factory=dict)
    finished: OrderedDict[str, None] = field(default_factory=OrderedDict)


@dataclass(frozen=True)
class CallTicket:
    """A call admitted into a rollout, holding its place in the rollout's order."""

    job_arn: str
    rollout_id: str
    sequence: int
    limits: JobLimits
    # 0 for the rollout's first call, 1 for its second, ...: the position its sampling seed mixes in.
    call_number: int


class JobRegistry:
    """Open jobs, their rollouts and counters."""

    def __init__(self, *, finished_ids_kept: int = FINISHED_IDS_KEPT) -> None:
        self._finished_ids_kept = finished_ids_kept
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}
        self._sequence = itertools.count()

    def open_job(self, job_arn: str, limits: JobLimits) -> None:
        if not job_arn:
            raise Rejection(400, "A job needs a non-empty job ARN.")
        if limits.max_tokens < 1 or limits.max_calls_per_rollout < 1 or limits.max_open_rollouts < 1:
            raise Rejection(
                400, "max_tokens, max_calls_per_rollout and max_open_rollouts must be at least 1."
            )
        if not limits.idle_rollout_s > 0:
            raise Rejection(400, "idle_rollout_s must be more than 0 seconds.")
        with self._lock:
            if job_arn in self._jobs:
                raise Rejection(409, f"Job {job_arn!r} is already open; close it before opening it again.")
            self._jobs[job_arn] = _Job(limits=limits)

    def close_job(self, job_arn: str) -> TokenCounters:
        """Forget the job and everything it holds; returns its final counters."""
        with self._lock:
            job = self._jobs.pop(job_arn, None)
        if job is None:
            raise Rejection(400, JOB_NOT_FOUND_MESSAGE)
        return job.counters.model_copy()

    def limits(self, job_arn: str) -> JobLimits:
        with self._lock:
            return self._job(job_arn).limits

    def open_rollout(self, job_arn: str, rollout_id: str) -> None:
        if not rollout_id:
            raise Rejection(400, "A rollout needs a non-empty rollout id.")
        with self._lock:
            job = self._job(job_arn)
            if rollout_id in job.rollouts or rollout_id in job.finished:
                raise Rejection(
                    409, f"Rollout {rollout_id!r} was already opened in this job; ids are single-use."
                )
            job.rollouts[rollout_id] = _Rollout(trace=RolloutTrace(job_arn=job_arn, rollout_id=rollout_id))

    def check_rollout(self, job_arn: str, rollout_id: str) -> None:
        """Raise the rejection a call for this rollout would get; opens nothing (``start_call`` does)."""
        with self._lock:
            job = self._job(job_arn)
            if rollout_id in job.rollouts:
                return
            if not (job.limits.auto_open_rollouts and rollout_id and rollout_id not in job.finished):
                raise self._missing_rollout(job, rollout_id)

    def start_call(self, job_arn: str, rollout_id: str) -> CallTicket:
        """Admit one call into the rollout, within the job's per-rollout call cap."""
        with self._lock:
            job = self._job(job_arn)
            rollout = self._rollout(job_arn, rollout_id)
            if rollout.calls_started >= job.limits.max_calls_per_rollout:
                raise Rejection(
                    400,
                    f"Rollout {rollout_id!r} already made {rollout.calls_started} calls, this job's "
                    "max_calls_per_rollout; end the episode.",
                )
            rollout.calls_started += 1
            rollout.last_active = time.monotonic()
            return CallTicket(
                job_arn, rollout_id, next(self._sequence), job.limits, call_number=rollout.calls_started - 1
            )

    def record_call(self, ticket: CallTicket, record: CallRecord) -> None:
        """Count the call's tokens for the job and add it to its rollout's trace (unless taken since)."""
        with self._lock:
            job = self._jobs.get(ticket.job_arn)
            if job is None:
                return
            job.counters.calls += 1
            job.counters.prefill_tokens += len(record.prompt_token_ids)
            job.counters.sample_tokens += len(record.completion_token_ids)
            rollout = job.rollouts.get(ticket.rollout_id)
            if rollout is not None:
                rollout.records.append((ticket.sequence, record))
                rollout.last_active = time.monotonic()

    def reject_call(
        self, job_arn: str | None, rollout_id: str | None, status: int = 400, message: str = ""
    ) -> None:
        """Count a refused call against its job and rollout, where those exist (it opens neither);
        the rollout keeps its first refusal's text, the trainer's reason when it fails the rollout.

        A refusal for credentials (401/403) counts only in the rollout's ``auth_refused_calls``: it
        came from whoever named the rollout, so it moves no count of the job's.
        """
        with self._lock:
            job = self._jobs.get(job_arn) if job_arn else None
            if job is None:
                return
            rollout = job.rollouts.get(rollout_id) if rollout_id else None
            if status in (401, 403):
                if rollout is not None:
                    rollout.trace.auth_refused_calls += 1
            else:
                job.counters.rejected_calls += 1
                if rollout is not None:
                    rollout.trace.rejected_calls += 1
            if rollout is not None and rollout.trace.first_refusal is None:
                rollout.trace.first_refusal = f"HTTP {status}: {message}"[:REFUSAL_TEXT_CHARS]

    def complete_rollout(self, job_arn: str, rollout_id: str, status: RolloutStatus) -> None:
        """The agent's report on a rollout its calls (or the trainer) opened; it opens none itself."""
        with self._lock:
            rollout = self._open_rollout(job_arn, rollout_id)
            rollout.trace.status = status.value
            rollout.last_active = time.monotonic()

    def update_reward(self, job_arn: str, rollout_id: str, rewards: list[float]) -> None:
        """The agent's reward for a rollout its calls (or the trainer) opened; it opens none itself."""
        with self._lock:
            rollout = self._open_rollout(job_arn, rollout_id)
            rollout.trace.rewards = list(rewards)
            rollout.last_active = time.monotonic()

    def take_trace(self, job_arn: str, rollout_id: str) -> RolloutTrace:
        """Hand the rollout's trace over and forget it; later calls for the rollout are refused."""
        with self._lock:
            job = self._job(job_arn)
            rollout = job.rollouts.pop(rollout_id, None)
            if rollout is None:
                raise self._missing_rollout(job, rollout_id)
            job.finished[rollout_id] = None
            while len(job.finished) > self._finished_ids_kept:
                job.finished.popitem(last=False)
        rollout.records.sort(key=lambda item: item[0])
        calls = [record.model_copy(update={"index": i}) for i, (_, record) in enumerate(rollout.records)]
        return rollout.trace.model_copy(update={"calls": calls})

    def counters(self, job_arn: str) -> TokenCounters:
        with self._lock:
            return self._job(job_arn).counters.model_copy()

    def last_active(self, job_arn: str, rollout_id: str) -> float | None:
        """When the rollout last made a model call or reported (``time.monotonic()``; its opening if
        it never did); None once its trace is taken or the job is closed. The stall watchdog reads it."""
        with self._lock:
            job = self._jobs.get(job_arn)
            rollout = job.rollouts.get(rollout_id) if job is not None else None
            return rollout.last_active if rollout is not None else None

    def open_rollout_count(self, job_arn: str) -> int:
        """How many rollouts of the job hold a trace not yet taken."""
        with self._lock:
            return len(self._job(job_arn).rollouts)

    def open_rollouts(self) -> int:
        """How many rollouts hold a trace not yet taken, over all open jobs."""
        with self._lock:
            return sum(len(job.rollouts) for job in self._jobs.values())

    def _job(self, job_arn: str) -> _Job:
        job = self._jobs.get(job_arn)
        if job is None:
            raise Rejection(400, JOB_NOT_FOUND_MESSAGE)
        return job

    def _open_rollout(self, job_arn: str, rollout_id: str) -> _Rollout:
        """A rollout already open in the job; never opens one."""
        job = self._job(job_arn)
        rollout = job.rollouts.get(rollout_id)
        if rollout is None:
            raise self._missing_rollout(job, rollout_id)
        return rollout

    def _rollout(self, job_arn: str, rollout_id: str) -> _Rollout:
        """A rollout open in the job; an auto-opening job opens it (for a chat call only)."""
        job = self._job(job_arn)
        rollout = job.rollouts.get(rollout_id)
        if rollout is not None:
            return rollout
        if job.limits.auto_open_rollouts and rollout_id and rollout_id not in job.finished:
            if len(job.rollouts) >= job.limits.max_open_rollouts:
                self._forget_idle(job)
            if len(job.rollouts) >= job.limits.max_open_rollouts:
                raise Rejection(
                    429,
                    f"This job already holds {len(job.rollouts)} open rollouts, its cap; take the "
                    "traces of finished ones (or raise the cap) before starting more.",
                )
            rollout = _Rollout(trace=RolloutTrace(job_arn=job_arn, rollout_id=rollout_id), auto_opened=True)
            job.rollouts[rollout_id] = rollout
            return rollout
        raise self._missing_rollout(job, rollout_id)

    def _forget_idle(self, job: _Job) -> None:
        """Drop the job's auto-opened rollouts idle past ``idle_rollout_s``; their ids count as finished."""
        cutoff = time.monotonic() - job.limits.idle_rollout_s
        idle = [
            key
            for key, rollout in job.rollouts.items()
            if rollout.auto_opened and rollout.last_active < cutoff
        ]
        for rollout_id in idle:
            del job.rollouts[rollout_id]
            job.finished[rollout_id] = None
        while len(job.finished) > self._finished_ids_kept:
            job.finished.popitem(last=False)

    @staticmethod
    def _missing_rollout(job: _Job, rollout_id: str) -> Rejection:
        if rollout_id in job.finished:
            return Rejection(
                409, f"Rollout {rollout_id!r} is finished: its trace was taken, so it takes no more calls."
            )
        return Rejection(
            404, f"Rollout {rollout_id!r} is not open in this job; the trainer opens rollouts before play."
        )
