"""SIGTERM (preemption) and Ctrl-C in ``rft train``: a checkpoint and a clean exit, or the way back.

SIGTERM is what Kubernetes, KubeRay and HyperPod send before they kill a pod. The first one asks the
loop to stop at its next safe point (``faults.on_sigterm``: right away while rollouts are playing, or
after the step), write a checkpoint and exit 0; ``faults.sigterm_grace_s`` bounds the wait. A second
SIGTERM or Ctrl-C exits at once: checkpoints are atomic, so the previous one stays whole, and every
process the run started ends with it (``handlers.tied_popen``).
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from trainer.config.faults import FaultsConfig
from trainer.learner.checkpoint import latest_checkpoint

log = logging.getLogger(__name__)

SIGTERM_EXIT = 128 + signal.SIGTERM  # the shell's code for a process ended by SIGTERM


class RunPreempted(Exception):
    """The run stopped on SIGTERM after writing ``checkpoint``; ``rft train`` exits 0."""

    def __init__(self, checkpoint: Path, step: int, abandoned: bool) -> None:
        self.checkpoint = checkpoint
        self.step = step
        self.abandoned = abandoned
        what = f"step {step} abandoned, its finished rollouts kept" if abandoned else f"after step {step}"
        super().__init__(f"stopped by SIGTERM ({what}); checkpoint {checkpoint}")


class Preemption:
    """The trainer's SIGTERM handling while a run is on; ``requested`` is what the loop checks."""

    def __init__(self, faults: FaultsConfig, checkpoint_dir: Path) -> None:
        self.faults = faults
        self.checkpoint_dir = checkpoint_dir
        self.requested = False
        self._previous: dict[int, Any] = {}
        self._timer: threading.Timer | None = None

    @property
    def abandon(self) -> bool:
        """Whether a step whose rollouts are still playing stops waiting for them now."""
        return self.requested and self.faults.on_sigterm == "abandon_step"

    def install(self) -> Preemption:
        """Take over SIGTERM; only the main thread may (elsewhere the run keeps Python's handling)."""
        if threading.current_thread() is threading.main_thread():
            self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_signal)
        return self

    def restore(self) -> None:
        """Python's handlers back, and no exit at the grace's end (the run is over)."""
        if self._timer is not None:
            self._timer.cancel()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested:
            log.error("%s again: exiting at once; %s", name, last_checkpoint_line(self.checkpoint_dir))
            os._exit(128 + signum)
        self.requested = True
        # Ctrl-C while the run stops is a second signal too.
        self._previous.setdefault(signal.SIGINT, signal.signal(signal.SIGINT, self._on_signal))
        self._timer = threading.Timer(self.faults.sigterm_grace_s, self._out_of_time)
        self._timer.daemon = True
        self._timer.start()
        log.warning(
            "%s: %s, then a checkpoint and exit (within %.0f s; a second signal exits at once)",
            name,
            "stopping the step in flight" if self.abandon else "finishing the step in flight",
            self.faults.sigterm_grace_s,
        )

    def _out_of_time(self) -> None:
        log.error(
            "SIGTERM: no checkpoint within faults.sigterm_grace_s (%.0f s), exiting; %s",
            self.faults.sigterm_grace_s,
            last_checkpoint_line(self.checkpoint_dir),
        )
        os._exit(SIGTERM_EXIT)


def last_checkpoint_line(checkpoint_dir: Path) -> str:
    """Where the newest checkpoint is, in words."""
    latest = latest_checkpoint(checkpoint_dir)
    if latest is None:
        return f"no checkpoint yet in {checkpoint_dir}: a new run starts over"
    return f"the last checkpoint is {latest}"


def resume_command(argv: list[str]) -> str:
    """The ``rft train`` command line that continues the run ``argv`` started (its flags kept)."""
    return shlex.join(["rft", "train", *[arg for arg in argv if arg != "--resume"], "--resume"])


def interrupted_message(argv: list[str], checkpoint_dir: Path) -> str:
    """The one line ``rft train`` prints on Ctrl-C instead of a traceback."""
    latest = latest_checkpoint(checkpoint_dir)
    if latest is None:
        return f"rft train: interrupted before the first checkpoint ({checkpoint_dir}); nothing to resume"
    return f"rft train: interrupted; the last checkpoint is {latest}; resume with `{resume_command(argv)}`"
