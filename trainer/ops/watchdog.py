"""The stall watchdog: a run that stops making progress says what is outstanding, where, since when.

While rollouts are outstanding, no rollout finishing and no token being sampled for
``faults.stall_warn_s`` is a stall: the watchdog logs (console and ``train.log``) a diagnosis: the
outstanding rollouts grouped by the agent target they were sent to, with the time since each group's
last model call, the engine's queue and the time of its last sampled token, the learner's state, and
its likeliest reading; ``rft status RUN`` shows it while the stall lasts (``stall.txt``). After
``faults.stall_timeout_s`` the stalled rollouts at agents fail by cause ``stalled`` or the run stops
with that diagnosis, as ``faults.on_stall_timeout`` says. Each stall goes into the next step record's
``stalls`` (metrics.jsonl) and the Prometheus series of :class:`trainer.ops.prometheus.StallSeries`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer.config.faults import FaultsConfig
from trainer.ops.prometheus import StallSeries
from trainer.ops.status import STALL_FILE

if TYPE_CHECKING:
    from policy_server.engines import EngineOccupancy
    from trainer.run import Run

log = logging.getLogger(__name__)

WAITING = "(waiting for a concurrency slot)"  # a rollout not sent to any agent yet


@dataclass
class _Outstanding:
    rollout_id: str
    step: int
    target: str
    idle_s: float  # since its last model call, or since it was opened if it made none


class StallWatchdog:
    """Polls the run's progress from a thread of its own; ``fatal`` holds the diagnosis that stops it."""

    def __init__(self, faults: FaultsConfig, run: Run) -> None:
        self.faults = faults
        self.run = run
        self.fatal: str | None = None
        self._progress: tuple[object, ...] = ()
        self._since = self._last_token_at = time.monotonic()
        self._sampled: tuple[int, int | None] = (-1, None)
        self._warned = self._acted = False
        self._stalls: list[dict[str, Any]] = []  # this stall's and earlier ones not yet in a step record
        self._current: dict[str, Any] | None = None  # this stall's entry
        self._lock = threading.Lock()
        self.series = StallSeries(run.session.server.metrics.registry)
        self._stop = threading.Event()
        limits = [value for value in (faults.stall_warn_s, faults.stall_timeout_s) if value is not None]
        # Every few seconds at most: vLLM's queue is read over HTTP from its /metrics.
        self._poll_s = min([5.0, *(limit / 4 for limit in limits)])
        self._thread = threading.Thread(target=self._watch, name="rftkit stall watchdog", daemon=True)
        self._enabled = bool(limits)
        self._stall_file = run.run_dir / STALL_FILE

    def start(self) -> StallWatchdog:
        if self._enabled:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._stall_file.unlink(missing_ok=True)

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self.check(time.monotonic())
            except Exception:  # the watchdog must never end the run by its own failure
                log.exception("stall watchdog")

    def check(self, now: float) -> None:
        """Note progress; past a limit, warn once per stall, then set ``fatal``."""
        session = self.run.session
        occupancy = self._occupancy()
        # Tokens are counted when a call ends; the hf engine's forward passes show a long call's progress.
        sampled = (
            session.server.counters(session.job_arn).sample_tokens,
            occupancy.forward_passes if occupancy is not None else None,
        )
        if sampled != self._sampled:
            self._sampled, self._last_token_at = sampled, now
        outstanding = self._outstanding(now)
        pending = list(self.run.pipeline.pending.values())
        progress = (*sampled, *sorted((rollouts.step, len(rollouts.finished())) for rollouts in pending))
        if progress != self._progress or not outstanding:
            self._progress, self._since, self._warned, self._acted = progress, now, False, False
            self._current = None
            self._stall_file.unlink(missing_ok=True)
            self.series.clear()
            return
        stalled_s = now - self._since
        self.series.stalled(stalled_s, len(outstanding))
        warn, timeout = self.faults.stall_warn_s, self.faults.stall_timeout_s
        if warn is not None and stalled_s >= warn and not self._warned:
            self._warned = True
            diagnosis = self.diagnose(outstanding, stalled_s, now)
            log.warning("%s", diagnosis)
            # What `rft status RUN` shows while the stall lasts.
            self._stall_file.write_text(diagnosis + "\n")
            self._record(diagnosis, stalled_s, outstanding, "warned", 0)
        if timeout is not None and stalled_s >= timeout and not self._acted and self.fatal is None:
            self._acted = True
            self._time_out(outstanding, stalled_s, now, timeout)

    def _time_out(
        self, outstanding: list[_Outstanding], stalled_s: float, now: float, timeout: float
    ) -> None:
        """Fail the stalled rollouts at agents by cause ``stalled``, or stop the run, as configured."""
        diagnosis = self.diagnose(outstanding, stalled_s, now)
        failed = 0
        if self.faults.on_stall_timeout == "fail_rollouts":
            failed = self._fail_at_agents(outstanding, timeout)
        if failed:
            log.warning(
                "%s\nfaults.stall_timeout_s (%g s): %d rollouts failed as stalled; the step goes on "
                "with the rest",
                diagnosis,
                timeout,
                failed,
            )
            self._record(diagnosis, stalled_s, outstanding, "failed_rollouts", failed)
            return
        # stop_run, or no rollout at an agent to fail (all wait for a concurrency slot). Recorded
        # before `fatal` is set: the loop writes the step record as soon as it sees `fatal`.
        self._record(diagnosis, stalled_s, outstanding, "stopped_run", 0)
        self.fatal = (
            f"{diagnosis}\nstopped by faults.stall_timeout_s ({timeout:g} s); the last checkpoint is "
            "where `--resume` starts"
        )
        log.error("%s", self.fatal)

    def _fail_at_agents(self, outstanding: list[_Outstanding], timeout: float) -> int:
        by_target: dict[str, list[_Outstanding]] = defaultdict(list)
        for rollout in outstanding:
            if rollout.target != WAITING:
                by_target[rollout.target].append(rollout)
        failed = 0
        for target, group in sorted(by_target.items()):
            quiet = min(rollout.idle_s for rollout in group)
            error = (
                f"stalled: no rollout finished and no token sampled for faults.stall_timeout_s "
                f"({timeout:g} s); its agent at {target} made no model call for {quiet:.0f} s"
            )
            ids = [rollout.rollout_id for rollout in group]
            failed += self.run.session.producer.fail_stalled(ids, error)
        return failed

    def _record(
        self, diagnosis: str, stalled_s: float, outstanding: list[_Outstanding], action: str, failed: int
    ) -> None:
        """Note the stall for the next step record: a timeout updates its warning's entry unless a step
        record took that already."""
        entry = {
            "stalled_s": round(stalled_s, 1),
            "rollouts": len(outstanding),
            "action": action,
            "failed": failed,
            "diagnosis": diagnosis,
        }
        with self._lock:
            if any(taken is self._current for taken in self._stalls):
                assert self._current is not None
                self._current.update(entry)
            else:
                self._stalls.append(entry)
                self._current = entry
        self.series.count(action)

    def take_stalls(self) -> list[dict[str, Any]]:
        """The stalls since the last call (a step record's ``stalls``)."""
        with self._lock:
            stalls, self._stalls = self._stalls, []
        return stalls

    def _occupancy(self) -> EngineOccupancy | None:
        """The engine's queue, if it can tell (vLLM's is read from its /metrics, which may not answer)."""
        occupancy = getattr(self.run.session.server.engine, "occupancy", None)
        try:
            return occupancy() if occupancy is not None else None
        except Exception:
            return None

    def _outstanding(self, now: float) -> list[_Outstanding]:
        session = self.run.session
        found = []
        for rollouts in list(self.run.pipeline.pending.values()):
            for request, played in zip(rollouts.requests, list(rollouts.played), strict=True):
                if played is not None:
                    continue
                last = session.server.registry.last_active(session.job_arn, request.rollout_id)
                target = session.producer.fanout.playing_at.get(request.rollout_id, WAITING)
                idle_s = now - last if last is not None else 0.0
                found.append(_Outstanding(request.rollout_id, rollouts.step, target, idle_s))
        return found

    def diagnose(self, outstanding: list[_Outstanding], stalled_s: float, now: float) -> str:
        """The diagnosis, in lines: what is outstanding where, the engine, the learner, the reading."""
        by_target: dict[str, list[_Outstanding]] = defaultdict(list)
        for rollout in outstanding:
            by_target[rollout.target].append(rollout)
        steps = sorted({rollout.step for rollout in outstanding})
        lines = [f"stall: no rollout finished and no token sampled for {stalled_s:.0f} s"]
        for target, group in sorted(by_target.items()):
            quiet = min(rollout.idle_s for rollout in group)
            lines.append(f"  {target}: {len(group)} rollouts, the latest model call {quiet:.0f} s ago")
        occupancy = self._occupancy()
        queue = "queue unknown"
        if occupancy is not None:
            queue = f"{occupancy.running} running, {occupancy.waiting} waiting"
        lines.append(f"  engine: {queue}; no token sampled for {now - self._last_token_at:.0f} s")
        lines.append(
            f"  learner: step {self.run.state.step} done, waiting for step {steps[0]}'s rollouts"
            + (f" (steps {', '.join(map(str, steps))} outstanding)" if len(steps) > 1 else "")
        )
        engine_busy = occupancy is not None and occupancy.running > 0
        lines.append(f"  likeliest: {self._reading(by_target, engine_busy)}")
        return "\n".join(lines)

    @staticmethod
    def _reading(by_target: dict[str, list[_Outstanding]], engine_busy: bool) -> str:
        if engine_busy:
            return "the engine holds calls but samples no token: the model server is stuck, not the agents"
        agents = [(target, group) for target, group in by_target.items() if target != WAITING]
        if not agents:
            return "no rollout reached an agent: every concurrency slot is held (max_concurrent_rollouts)"
        target, group = max(agents, key=lambda item: len(item[1]))
        quiet = min(rollout.idle_s for rollout in group)
        return (
            f"{len(group)} rollouts at {target} made no model call for {quiet:.0f} s: "
            "the agent is stuck, not the model"
        )
