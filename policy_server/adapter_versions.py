"""``AdapterVersions``: which adapter version serves new calls, which ones calls still use, which
rollouts are pinned, and so which loaded versions can be unloaded."""

from __future__ import annotations

import threading
from collections import Counter


class AdapterVersions:
    """Which adapter version is current, how many calls each version has in flight, and which
    rollouts are pinned to a version.

    Calls acquire and release on the server's event loop; the trainer pins and unpins rollouts from
    its own threads, hence the lock (never held across an await).
    """

    def __init__(self) -> None:
        self.current = 0
        self.loaded: set[int] = set()
        self.in_flight: Counter[int] = Counter()
        self.last_issued = 0
        self._pins: dict[tuple[str, str], int] = {}
        self._pinned: Counter[int] = Counter()
        self._lock = threading.Lock()

    def pin(self, key: tuple[str, str], version: int) -> None:
        with self._lock:
            if version != 0 and version not in self.loaded:
                raise ValueError(f"adapter version {version} is not loaded, so no rollout can sample on it")
            self._pins[key] = version
            self._pinned[version] += 1

    def unpin(self, key: tuple[str, str]) -> None:
        with self._lock:
            version = self._pins.pop(key, None)
            if version is not None:
                self._pinned[version] -= 1
                if self._pinned[version] <= 0:
                    del self._pinned[version]

    def unpin_job(self, job_arn: str) -> None:
        for key in [key for key in self._pins if key[0] == job_arn]:
            self.unpin(key)

    def pinned_versions(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(sorted(self._pinned))

    def acquire(self, key: tuple[str, str]) -> int:
        """The version a call of rollout ``key`` samples on: its pinned one, else the current one."""
        with self._lock:
            version = self._pins.get(key, self.current)
            self.in_flight[version] += 1
            return version

    def release(self, version: int) -> None:
        with self._lock:
            self.in_flight[version] -= 1
            if self.in_flight[version] <= 0:
                del self.in_flight[version]

    def retired(self) -> list[int]:
        """Loaded versions that are not current, that no call in flight uses and no rollout is pinned to."""
        with self._lock:
            return sorted(
                v
                for v in self.loaded
                if v != self.current and self.in_flight[v] == 0 and self._pinned[v] == 0
            )
