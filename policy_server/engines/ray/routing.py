"""Which replica serves a call: sticky per rollout, new rollouts to the replica with fewest calls out.

A rollout's calls share a growing prefix (the conversation so far), so keeping them on one replica
lets its prefix cache (vLLM's automatic prefix caching) skip recomputing it. A rollout is assigned
once, on its first call, to the live replica with the fewest outstanding calls; it moves only when
its replica is no longer live. Pure bookkeeping, no Ray: the engine calls it from one event loop.
"""

from __future__ import annotations

from collections import OrderedDict


class NoLiveReplica(RuntimeError):
    """Every replica is down (dead, or restarting and not yet back)."""


class StickyRouter:
    """Rollout-to-replica assignments and each replica's outstanding calls."""

    def __init__(self, replicas: int, *, max_remembered: int = 65536) -> None:
        """``max_remembered`` bounds the assignments kept: the least recently used are forgotten (a
        rollout that calls again after that is assigned afresh, which costs only its prefix cache)."""
        if replicas < 1:
            raise ValueError(f"a router needs at least one replica, got {replicas}")
        self.outstanding = [0] * replicas
        self.calls = [0] * replicas  # calls routed to each replica, for metrics and tests
        self.moved = 0  # rollouts reassigned because their replica was no longer live
        self._assigned: OrderedDict[str, int] = OrderedDict()
        self._max_remembered = max_remembered

    def route(self, rollout_id: str | None, live: set[int]) -> int:
        """The replica for one call of ``rollout_id`` (None: no rollout, least loaded each time)."""
        if not live:
            raise NoLiveReplica("no inference replica is live (all died or are restarting)")
        if rollout_id is not None:
            replica = self._assigned.get(rollout_id)
            if replica is not None and replica in live:
                self._assigned.move_to_end(rollout_id)
                return replica
            if replica is not None:
                self.moved += 1
        replica = min(live, key=lambda index: (self.outstanding[index], index))
        if rollout_id is not None:
            self._assigned[rollout_id] = replica
            self._assigned.move_to_end(rollout_id)
            while len(self._assigned) > self._max_remembered:
                self._assigned.popitem(last=False)
        return replica

    def begin(self, replica: int) -> None:
        self.outstanding[replica] += 1
        self.calls[replica] += 1

    def end(self, replica: int) -> None:
        self.outstanding[replica] -= 1

    def assignment(self, rollout_id: str) -> int | None:
        """The replica ``rollout_id`` is assigned to, if any."""
        return self._assigned.get(rollout_id)
