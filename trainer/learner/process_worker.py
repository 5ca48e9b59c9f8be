"""A learner process of this node: ``python -m trainer.learner.process_worker``, started by
:class:`trainer.learner.processes.ProcessLearner`.

It reads its orders from the connection whose file descriptor ``RFTKIT_LEARNER_FD`` names (one end
of a socket pair the trainer holds the other end of): first ``(rank, world, init_method, model_dir,
config, placement, sharded)``, then ``(method, args)`` calls on its
:class:`~trainer.learner.worker.LearnerWorker` (the Ray learner worker's body), each answered
``("ok", result)`` or ``("error", text)`` after a ``("progress", None)`` for each micro-batch pass
done, until ``None`` or the connection closes. Between calls
it waits on the connection, never in a collective, so a long rollout phase meets no timeout.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

FD_VARIABLE = "RFTKIT_LEARNER_FD"
CALLS = frozenset(
    {
        "train_step",
        "shard_old_logprobs",
        "adapter_state",
        "training_state",
        "restore",
        "save_adapter",
        "save_sharded_state",
        "restore_sharded",
        "image_token_id",
    }
)


def send(connection: Connection, message: Any) -> None:
    """``message`` pickled plainly: torch's multiprocessing pickler would pass tensors as shared
    memory through a resource sharer that only processes of one multiprocessing family can reach."""
    connection.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive(connection: Connection) -> Any:
    """What :func:`send` sent (EOFError once the other end closed)."""
    return pickle.loads(connection.recv_bytes())


def _threads(world: int) -> None:
    """On the CPU, the node's cores shared among the learner processes (torch would give each all
    of them, and the processes would fight over the cores); ``OMP_NUM_THREADS``, when set, wins."""
    import torch

    wanted = os.environ.get("OMP_NUM_THREADS", "")
    torch.set_num_threads(
        int(wanted) if wanted.isdigit() and int(wanted) > 0 else max(1, (os.cpu_count() or 1) // world)
    )


def _serve(connection: Connection) -> None:
    from trainer.learner.worker import LearnerWorker, to_cpu

    rank, world, init_method, model_dir, config, placement, sharded = receive(connection)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s learner process {rank}: %(levelname)s %(name)s: %(message)s"
    )
    if placement.learner_device == "cpu":
        _threads(world)
    worker = LearnerWorker(model_dir, config, placement, rank, world, sharded=sharded)
    try:
        worker.join(init_method)
    except Exception:
        send(connection, ("error", traceback.format_exc()))
        return
    send(connection, ("ok", os.getpid()))
    # Each micro-batch pass done tells the trainer this rank still works (it bounds its wait by these).
    worker.on_pass(lambda: send(connection, ("progress", None)))
    while True:
        order: tuple[str, tuple[Any, ...]] | None = receive(connection)
        if order is None:
            return
        method, args = order
        try:
            if method not in CALLS:
                raise ValueError(f"a learner process has no call {method!r}")
            result = to_cpu(getattr(worker, method)(*args))
        except Exception:
            send(connection, ("error", traceback.format_exc()))
            continue
        send(connection, ("ok", result))


def main() -> int:
    connection = Connection(int(os.environ[FD_VARIABLE]))
    try:
        _serve(connection)
    except EOFError:  # the trainer went away: nothing to answer
        return 0
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # Every answer is sent and every file written and closed: the interpreter's own teardown (torch's
    # and the process group's threads) took seconds per learner process, for nothing.
    os._exit(code)
