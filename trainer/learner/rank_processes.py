"""The trainer's side of its learner processes: :class:`RankProcesses` sends each call to every rank
over its socket pair and gathers the answers, naming the rank to blame when one fails.

A rank dies (its process ended: named at once), hangs while the others work (they give up in their
next collective after ``learner.collective_timeout_s``, answer with the error, and the silent rank
is named a few seconds later), or every rank hangs at once, which leaves no rank to give up. A
working rank reports each micro-batch pass it finishes (:mod:`trainer.learner.process_worker`) and a
rank waiting in a collective answers within the collective timeout, so a call during which no rank
is heard from for the collective timeout plus a margin ends naming every rank that did not answer.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from trainer.errors import TrainingError
from trainer.learner.process_worker import receive, send

_STOP_S = 10.0  # how long a closed learner process has to exit before it is killed
# After one rank failed, how long the others have to answer before they are taken to be hung.
_SETTLE_S = 5.0
# How long after the collective timeout a rank that gave up in a collective has to answer (its error
# formatted and sent); beyond it, with no rank heard from, every rank that has not answered is hung.
ANSWER_MARGIN_S = 30.0


class LearnerProcessDied(TrainingError):
    """Learner processes died or stopped answering during a call: the step cannot finish."""

    def __init__(self, rank: int, world: int, what: str, call: str, ranks: Sequence[int] = ()) -> None:
        self.rank, self.ranks = rank, list(ranks) or [rank]
        who = f"learner process {rank}"
        if len(self.ranks) > 1:
            who = "learner processes " + ", ".join(map(str, self.ranks[:-1])) + f" and {self.ranks[-1]}"
        super().__init__(
            f"{who} of {world} {what} during {call}: the step cannot finish, so the run stops; "
            "`rft train --resume` continues from the newest checkpoint"
        )


class RankProcesses:
    """Learner processes (rank order) and the trainer's end of each one's socket pair.
    ``timeout_s``: their ``learner.collective_timeout_s``; ``margin_s``: how long after it a rank
    that gave up in a collective has to answer."""

    def __init__(
        self,
        processes: Sequence[subprocess.Popen[bytes]],
        connections: Sequence[Connection],
        timeout_s: float,
        margin_s: float = ANSWER_MARGIN_S,
    ) -> None:
        self.processes, self.connections = list(processes), list(connections)
        self.world, self.timeout_s, self.margin_s = len(self.processes), timeout_s, margin_s

    @property
    def quiet_s(self) -> float:
        """How long a call may go without a word from any rank (an answer, a pass done) before the
        ranks that have not answered are taken to be hung."""
        return self.timeout_s + self.margin_s

    def call(self, method: str, *args: Any) -> list[Any]:
        """``method(*args)`` on every rank; their results, rank order."""
        for connection in self.connections:
            send(connection, (method, args))
        return self.gather(method)

    def gather(self, call: str, *, bounded: bool = True) -> list[Any]:
        """Every rank's answer to ``call`` (``bounded``: silence bounded by :attr:`quiet_s`); on a
        failure, every process stopped and the failure raised with the ranks to blame
        (:class:`LearnerProcessDied`) or the rank's own error."""
        answers: dict[int, Any] = {}
        errors: dict[int, str] = {}
        rank_of = {id(connection): rank for rank, connection in enumerate(self.connections)}
        pending = list(self.connections)
        while pending:
            ready = wait(pending, timeout=_SETTLE_S if errors else self.quiet_s if bounded else None)
            if not ready:
                break  # the rest said nothing for too long: hung
            for connection in ready:
                assert isinstance(connection, Connection)
                try:
                    status, value = receive(connection)
                except (EOFError, OSError):
                    status, value = "error", "its connection closed"
                if status == "progress":  # a pass done: still working
                    continue
                pending.remove(connection)
                (answers if status == "ok" else errors)[rank_of[id(connection)]] = value
        if not errors and not pending:
            return [answers[rank] for rank in range(self.world)]
        silent = [rank_of[id(connection)] for connection in pending]
        failure = self._failure(call, errors, silent)
        for rank in silent:  # hung: it would not exit when asked
            self.processes[rank].kill()
        self.stop()
        raise failure

    def stop(self) -> None:
        """Ask every learner process to exit; kill the ones that do not within a few seconds."""
        for connection in self.connections:
            try:
                send(connection, None)
            except OSError:  # already gone
                pass
            connection.close()
        for process in self.processes:
            try:
                process.wait(timeout=_STOP_S)
            except Exception:
                process.kill()
                process.wait()

    def _failure(self, call: str, errors: dict[int, str], silent: list[int]) -> TrainingError:
        """What went wrong: a rank whose process ended, else the ranks that never answered, else
        the first rank's own error (the same on every rank: a bad batch, a full disk)."""
        for rank, process in enumerate(self.processes):
            if rank in errors and "connection closed" in errors[rank]:
                try:
                    process.wait(timeout=_STOP_S)
                except Exception:
                    continue
            code = process.poll()
            if code is not None:
                what = f"(pid {process.pid}) died ({_exit_cause(code)})"
                return LearnerProcessDied(rank, self.world, what, call)
        if silent and not errors:
            pids = ", ".join(str(self.processes[rank].pid) for rank in silent)
            what = (
                f"(pid{'s' if len(silent) > 1 else ''} {pids}) stopped answering (no rank answered or "
                f"finished a micro-batch for {self.quiet_s:g} s: learner.collective_timeout_s = "
                f"{self.timeout_s:g} s plus {self.margin_s:g} s)"
            )
            return LearnerProcessDied(silent[0], self.world, what, call, silent)
        if silent:
            what = (
                f"(pid {self.processes[silent[0]].pid}) stopped answering (the other ranks gave up waiting "
                f"for it in a collective after learner.collective_timeout_s = {self.timeout_s:g} s)"
            )
            return LearnerProcessDied(silent[0], self.world, what, call)
        rank = min(errors)
        text = errors[rank].strip().splitlines()
        return TrainingError(
            f"learner process {rank} of {self.world} failed during {call}: {text[-1]}\n" + errors[rank]
        )


def _exit_cause(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"
