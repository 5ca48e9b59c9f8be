"""The trainer's wait for its learner processes (trainer/learner/rank_processes.py), with real
processes that speak the learner process's protocol: a call that runs longer than the bound on
silence completes while its ranks report their passes; ranks that all stop answering end the call
after the bound, named, and stopped.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from handlers import tied_popen
from tests.conftest import REPO_ROOT
from trainer.learner.rank_processes import LearnerProcessDied, RankProcesses

# A rank that answers each call after four passes of 0.4 s, reporting each pass.
RANK = """
import sys, time
from multiprocessing.connection import Connection
from trainer.learner.process_worker import receive, send
connection = Connection(int(sys.argv[1]))
while (order := receive(connection)) is not None:
    for _ in range(4):
        time.sleep(0.4)
        send(connection, ("progress", None))
    send(connection, ("ok", order[0]))
"""


@pytest.fixture
def ranks() -> Iterator[RankProcesses]:
    processes: list[subprocess.Popen[bytes]] = []
    connections = []
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    for _ in range(2):
        ours, theirs = multiprocessing.Pipe()
        command = [sys.executable, "-c", RANK, str(theirs.fileno())]
        processes.append(tied_popen(command, env=env, pass_fds=(theirs.fileno(),)))
        theirs.close()
        connections.append(ours)
    # Silence is bounded at a second: the calls take 1.6 s.
    yield RankProcesses(processes, connections, timeout_s=0.5, margin_s=0.5)
    for process in processes:
        process.kill()
        process.wait()


def test_ranks_that_report_their_passes_are_waited_for_and_ranks_all_silent_are_named(
    ranks: RankProcesses,
) -> None:
    assert ranks.call("train_step") == ["train_step", "train_step"]
    for process in ranks.processes:
        os.kill(process.pid, signal.SIGSTOP)
    started = time.monotonic()
    with pytest.raises(LearnerProcessDied) as failure:
        ranks.call("train_step")
    assert time.monotonic() - started < 10
    assert failure.value.ranks == [0, 1]
    pids = ", ".join(str(process.pid) for process in ranks.processes)
    assert str(failure.value) == (
        f"learner processes 0 and 1 of 2 (pids {pids}) stopped answering (no rank answered or finished a "
        "micro-batch for 1 s: learner.collective_timeout_s = 0.5 s plus 0.5 s) during train_step: the "
        "step cannot finish, so the run stops; `rft train --resume` continues from the newest checkpoint"
    )
    assert all(process.poll() is not None for process in ranks.processes)  # killed, none left stopped
