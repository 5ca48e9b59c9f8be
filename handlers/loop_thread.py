"""An asyncio event loop in a daemon thread: the one way rftkit runs coroutines beside a sync caller.

The trainer's rollouts play on one (``trainer.rollouts.producer``), the gateway pool's job state lives
on one, and :class:`handlers.serving.ServingThread` serves uvicorn on one. Other threads hand it
coroutines with :meth:`LoopThread.submit` (a future) or :meth:`LoopThread.run` (the result).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

ResultT = TypeVar("ResultT")


class LoopThread:
    """An asyncio event loop running in a daemon thread named ``name``."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)

    def start(self) -> LoopThread:
        self._thread.start()
        return self

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, coro: Coroutine[Any, Any, ResultT]) -> Future[ResultT]:
        """Schedule ``coro`` on the loop; its future resolves in the caller's thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, ResultT], timeout: float | None = None) -> ResultT:
        """Run ``coro`` on the loop and wait for its result (at most ``timeout`` seconds)."""
        return self.submit(coro).result(timeout)

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the loop and join the thread; close the loop once the thread ended. True if it did."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        if not self.loop.is_closed():
            self.loop.close()
        return True

    def close(self, last: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Cancel every task still running, await ``last()`` on the loop, then stop."""
        if self._thread.is_alive():
            self.run(_cancel_all(last))
        self.stop()


async def _cancel_all(last: Callable[[], Coroutine[Any, Any, None]]) -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await last()
