"""``rft sft``'s progress line: the step, the loss, the time spent, the pace and the time left.

The pace is measured from the end of the first step, so loading the model does not count as
training time; the time spent counts from the start.

A line is printed every ``every_steps`` steps or once ``every_seconds`` have passed since the last
one, whichever comes first, and at the last step, so a slow run (a tiny gpt-oss on the CPU takes
seconds a step) says how long it will take before the user wonders whether it is stuck.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def clock_text(seconds: float) -> str:
    """``seconds`` as ``1h02m03s``, ``2m03s`` or ``3s``."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class SftProgress:
    """The ``on_step`` of :func:`trainer.sft.run_sft` that prints ``rft sft``'s progress lines."""

    def __init__(
        self,
        steps: int,
        *,
        every_steps: int | None = None,
        every_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        write: Callable[[str], None] | None = None,
    ) -> None:
        self.steps = steps
        self.every_steps = every_steps or max(1, steps // 10)
        self.every_seconds = every_seconds
        self._clock = clock
        self._write = write or (lambda line: print(line, flush=True))
        self._started = self._last = clock()
        self._first: tuple[int, float] | None = None  # the first step seen and when it ended

    def __call__(self, step: int, loss: float) -> None:
        now = self._clock()
        self._first = self._first or (step, now)
        due = step % self.every_steps == 0 or now - self._last >= self.every_seconds
        if not (due or step == self.steps):
            return
        self._last = now
        elapsed = now - self._started
        pace = self._pace(step, now, elapsed)
        left = f"eta {clock_text((self.steps - step) / pace)}" if pace > 0 else "eta unknown"
        self._write(
            f"sft step {step}/{self.steps}  loss {loss:.4f}  elapsed {clock_text(elapsed)}  "
            f"{pace:.2f} steps/s  {left}"
        )

    def _pace(self, step: int, now: float, elapsed: float) -> float:
        """Steps a second since the first step ended (the time before it loaded the model), or over
        the whole run while only one step has been seen."""
        assert self._first is not None
        first_step, first_at = self._first
        if step > first_step and now > first_at:
            return (step - first_step) / (now - first_at)
        return step / elapsed if elapsed > 0 else 0.0
