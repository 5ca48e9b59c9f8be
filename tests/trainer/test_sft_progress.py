"""``rft sft``'s progress (issue 50.9): every 12 steps of 120 or every 10 s, whichever comes first,
with the time spent, the pace and the time left. Before, only ``sft step 12/120  loss 1.2345``
came, every 12 steps, with no time at all (120 steps on a tiny gpt_oss took 13 minutes)."""

from __future__ import annotations

from trainer.sft.progress import SftProgress, clock_text


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_lines_come_every_ten_seconds_or_every_tenth_of_the_steps_with_the_time_left() -> None:
    clock, lines = FakeClock(), []
    progress = SftProgress(120, clock=clock, write=lines.append)
    clock.now = 5.0  # loading the model
    for step in range(1, 121):
        clock.now += 0.0 if step == 1 else 2.0  # the first step ends at 5 s, then 2 s a step
        progress(step, 1.0 / step)
    assert lines[:3] == [
        "sft step 4/120  loss 0.2500  elapsed 11s  0.50 steps/s  eta 3m52s",
        "sft step 9/120  loss 0.1111  elapsed 21s  0.50 steps/s  eta 3m42s",
        "sft step 12/120  loss 0.0833  elapsed 27s  0.50 steps/s  eta 3m36s",
    ]
    assert lines[-1] == "sft step 120/120  loss 0.0083  elapsed 4m03s  0.50 steps/s  eta 0s"
    # No gap between lines is longer than 10 s or 12 steps.
    steps = [int(line.split()[2].split("/")[0]) for line in lines]
    assert max(b - a for a, b in zip(steps, steps[1:], strict=False)) <= 12


def test_fast_steps_print_every_tenth_of_the_run_only() -> None:
    clock, lines = FakeClock(), []
    progress = SftProgress(30, clock=clock, write=lines.append)
    for step in range(1, 31):
        clock.now += 0.01
        progress(step, 0.5)
    assert [line.split()[2] for line in lines] == [f"{step}/30" for step in range(3, 31, 3)]


def test_clock_text() -> None:
    assert [clock_text(s) for s in (0.4, 59.6, 61, 3723)] == ["0s", "1m00s", "1m01s", "1h02m03s"]
