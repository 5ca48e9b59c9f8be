"""A gateway worker's view of the job state held by the trainer's process (over a state link).

:class:`RemoteRegistry` has :class:`~policy_server.jobs.JobRegistry`'s methods and
:class:`RemoteVersions` the adapter-version bookkeeping :class:`~policy_server.server.PolicyServer`
uses, so a worker runs the gateway's unchanged code. What decides anything (admitting a call into
its rollout, its call number, recording it, the current adapter version) is asked of the state
process on every call; the worker caches only what a refusal from the state process corrects:

- a job's limits (replaced by the limits every admitted call's ticket carries);
- rollouts seen open, for the early check before a body is read: a rollout taken since is still
  refused, with the same answer, by ``start_call``.

A call's record is sent, and acknowledged, before the agent gets its answer, so a trace the trainer
takes after an episode ended holds every call, and a worker that dies loses no finished call.
"""

from __future__ import annotations

from collections import OrderedDict

from handlers import RolloutStatus
from policy_server.jobs import CallTicket, JobLimits
from policy_server.trace import CallRecord, RolloutTrace, TokenCounters
from policy_server.workers.state_link import StateClient

# Rollouts remembered as open per worker; older ones are simply asked about again.
OPEN_ROLLOUTS_CACHED = 65_536


class RemoteRegistry:
    """:class:`~policy_server.jobs.JobRegistry`'s methods, answered by the state process."""

    def __init__(self, link: StateClient) -> None:
        self._link = link
        self._limits: dict[str, JobLimits] = {}
        self._seen_open: OrderedDict[tuple[str, str], None] = OrderedDict()

    def open_job(self, job_arn: str, limits: JobLimits) -> None:
        self._link.call("open_job", job_arn, limits)

    def close_job(self, job_arn: str) -> TokenCounters:
        self._limits.pop(job_arn, None)
        counters: TokenCounters = self._link.call("close_job", job_arn)
        return counters

    def limits(self, job_arn: str) -> JobLimits:
        limits = self._limits.get(job_arn)
        if limits is None:
            limits = self._limits[job_arn] = self._link.call("limits", job_arn)
        return limits

    def open_rollout(self, job_arn: str, rollout_id: str) -> None:
        self._link.call("open_rollout", job_arn, rollout_id)

    def check_rollout(self, job_arn: str, rollout_id: str) -> None:
        key = (job_arn, rollout_id)
        if key in self._seen_open:
            return
        self._link.call("check_rollout", job_arn, rollout_id)
        self._seen_open[key] = None
        if len(self._seen_open) > OPEN_ROLLOUTS_CACHED:
            self._seen_open.popitem(last=False)

    def start_call(self, job_arn: str, rollout_id: str) -> CallTicket:
        ticket: CallTicket = self._link.call("start_call", job_arn, rollout_id)
        self._limits[job_arn] = ticket.limits
        return ticket

    def record_call(self, ticket: CallTicket, record: CallRecord) -> None:
        self._link.call("record_call", ticket, record)

    def reject_call(
        self, job_arn: str | None, rollout_id: str | None, status: int = 400, message: str = ""
    ) -> None:
        self._link.send("reject_call", job_arn, rollout_id, status, message)

    def complete_rollout(self, job_arn: str, rollout_id: str, status: RolloutStatus) -> None:
        self._link.call("complete_rollout", job_arn, rollout_id, status)

    def update_reward(self, job_arn: str, rollout_id: str, rewards: list[float]) -> None:
        self._link.call("update_reward", job_arn, rollout_id, rewards)

    def take_trace(self, job_arn: str, rollout_id: str) -> RolloutTrace:
        trace: RolloutTrace = self._link.call("take_trace", job_arn, rollout_id)
        return trace

    def counters(self, job_arn: str) -> TokenCounters:
        counters: TokenCounters = self._link.call("counters", job_arn)
        return counters

    def open_rollout_count(self, job_arn: str) -> int:
        return int(self._link.call("open_rollout_count", job_arn))

    def open_rollouts(self) -> int:
        return int(self._link.call("open_rollouts"))


class RemoteVersions:
    """Adapter versions as a worker sees them: the state process picks and releases them.

    The state process loads and unloads adapters (it knows every worker's calls in flight), so a
    worker never retires a version itself: ``retired()`` is always empty here.
    """

    def __init__(self, link: StateClient) -> None:
        self._link = link
        # The version this worker's last call got; PolicyServer.complete compares against it only to
        # decide whether to look for retired versions, which this worker never unloads.
        self.current = 0
        self.loaded: set[int] = set()

    def acquire(self, key: tuple[str, str]) -> int:
        self.current = int(self._link.call("acquire", *key))
        return self.current

    def release(self, version: int) -> None:
        self._link.send("release", version)

    def retired(self) -> list[int]:
        return []

    def unpin(self, key: tuple[str, str]) -> None:
        """Nothing to do here: rollouts are pinned to versions in the state process only (the trainer
        opens them there), and a worker's take-trace reaches that process's server, which unpins."""

    def unpin_job(self, job_arn: str) -> None:
        """Nothing to do here: a worker's close-job reaches the state process's server, which unpins."""
