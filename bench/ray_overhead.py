"""Benchmark: what a learner step costs on Ray learner workers beyond the same step in one process.

``RayLearner`` (``trainer/learner/distributed.py``) runs the one-process ``Learner``'s step on
``ray.learner_workers`` actors: the driver puts the batch into Ray's object store, each worker fetches
it, computes its share of the micro-batches, all-reduces the LoRA gradients (gloo on CPU) and steps;
after the step the loop fetches rank 0's adapter (written to a temporary directory there, sent as
bytes, written again on the driver). This times, on the same batch, alternating in one run:

- ``step``: ``train_step`` of the one-process learner and of ``RayLearner`` with 1 and 2 workers;
- ``adapter``: ``save_adapter`` of each (the adapter back to the driver, once per step in training).

The one-process learner runs with one torch thread, as each Ray worker does (Ray gives an actor of
``learner_num_cpus: 1`` one thread): with one worker the ratio compares the same compute; two workers
use two cores against its one. The Ray side is split into the batch's ``ray.put`` (timed alone, the same
object), each worker's task as Ray's timeline records it (arguments fetched and deserialised, the
call executed, its result stored) and the gradient exchange inside the step (the workers'
``_combine``, timed on the same workers afterwards); what the driver waits beyond the slowest
worker's task is Ray's dispatch and the result's return.

    .venv/bin/python -m bench.ray_overhead [--model DIR --name NAME] [--sequences 16] [--length 96]

Without ``--model`` it builds the tiny model in a temporary directory. Results go to
``bench/results/ray_overhead[-NAME].json``. A local cluster of one logical CPU per worker (3: one
worker and two, both kept alive; they run in turn, never together).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray
import torch

from policy_server.models.tiny import build_tiny_model
from trainer.algo.sequences import TrainingSequence, micro_batches_by_token_budget
from trainer.config import TrainConfig
from trainer.learner.batch_images import ship
from trainer.learner.distributed import RayLearner
from trainer.learner.learner import Learner
from trainer.learner.steps import GradientSums
from trainer.scale.ray_cluster import start_local_cluster

RESULTS = Path(__file__).resolve().parent / "results"
CALLS = ("step", "adapter")


def learner_config(workers: int, micro_tokens: int) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "learning_rate": 1e-4,
            "lora": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0},
            "learner": {"device": "cpu", "dtype": "float32"},
            "max_tokens_per_microbatch": micro_tokens,
            "ray": {"learner_workers": workers},
        }
    )


def make_batch(learner: Learner, count: int, length: int) -> list[TrainingSequence]:
    """``count`` random sequences of ``length`` tokens (a third prompt), two per episode, with the
    learner's own logprobs as the sampler's."""
    rng = random.Random(0)
    vocab = learner.model.config.vocab_size
    prompt = length // 3
    sequences = [
        TrainingSequence(
            rollout_id=f"episode-{index // 2}",
            token_ids=[rng.randrange(vocab) for _ in range(length)],
            loss_mask=[0] * prompt + [1] * (length - prompt),
            advantage=(1.0, -0.5, 0.25, -1.0)[index % 4],
            num_calls=1,
        )
        for index in range(count)
    ]
    old = learner.old_logprobs(sequences)
    return [
        replace(sequence, behavior_logprobs=lp.tolist()) for sequence, lp in zip(sequences, old, strict=True)
    ]


@dataclass
class Side:
    """One learner under test and its timed calls: (seconds, wall start, wall end) per call."""

    name: str
    learner: Learner | RayLearner
    samples: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)

    def timed(self, call: str, run: Callable[[], object]) -> None:
        wall, started = time.time(), time.perf_counter()
        run()
        seconds = time.perf_counter() - started
        self.samples.setdefault(call, []).append((seconds, wall, time.time()))

    def median(self, call: str) -> float:
        return statistics.median(seconds for seconds, _, _ in self.samples[call])


def _exchange_seconds(worker: Any, repeats: int) -> float:
    """Inside a learner worker (``__ray_call__``): the median time of the step's gradient exchange
    (``_combine``: the gathered sums and the all-reduce of every LoRA gradient), on zero gradients."""
    import torch.distributed as dist

    learner = worker.learner
    for parameter in learner.trainable:
        parameter.grad = torch.zeros_like(parameter)
    seconds = []
    for _ in range(repeats):
        dist.barrier()
        started = time.perf_counter()
        learner._combine(GradientSums())
        seconds.append(time.perf_counter() - started)
    learner.optimizer.zero_grad(set_to_none=True)
    return statistics.median(seconds)


def _worker_threads(worker: Any) -> int:
    return torch.get_num_threads()


def task_phases(events: list[dict[str, Any]], method: str, windows: list[tuple[float, float, float]]) -> dict:
    """Median seconds of each phase of the ``LearnerWorker.method`` tasks run within ``windows`` (the
    driver's calls), the slowest worker's per call, from Ray's timeline (microsecond timestamps)."""
    tasks = [event for event in events if event.get("cat") == f"task::LearnerWorker.{method}"]
    phases: dict[str, list[float]] = {"task": [], "arguments": [], "execute": [], "store_outputs": []}
    names = {
        "task:deserialize_arguments": "arguments",
        "task:execute": "execute",
        "task:store_outputs": "store_outputs",
    }
    for _, start, end in windows:
        mine = [task for task in tasks if start * 1e6 <= task["ts"] <= end * 1e6]
        if not mine:
            continue
        slowest = max(mine, key=lambda task: task["dur"])
        phases["task"].append(slowest["dur"] / 1e6)
        for event in events:
            inside = slowest["ts"] <= event["ts"] <= slowest["ts"] + slowest["dur"]
            if event.get("tid") == slowest["tid"] and event.get("cat") in names and inside:
                phases[names[event["cat"]]].append(event["dur"] / 1e6)
    return {name: statistics.median(values) for name, values in phases.items() if values}


def run_rounds(sides: list[Side], batch: list[TrainingSequence], repeats: int, work: Path) -> list[float]:
    """``repeats`` rounds (after one warm-up round, dropped) of every side's step and adapter fetch,
    alternating; returns the batch's ``ray.put`` times, one per round."""
    puts = []
    for round_ in range(repeats + 1):
        started = time.perf_counter()
        ref = ray.put(ship(batch, None))
        puts.append(time.perf_counter() - started)
        del ref
        for side in sides:
            learner, directory = side.learner, work / side.name / str(round_)
            side.timed("step", lambda learner=learner, seed=round_: learner.train_step(batch, seed=seed))
            side.timed("adapter", lambda learner=learner, at=directory: learner.save_adapter(at))
        if round_ == 0:
            for side in sides:
                side.samples.clear()
            puts.clear()
    return puts


def compare(local: Side, rays: list[Side], events: list[dict[str, Any]], exchange: dict[str, float]) -> dict:
    """Per worker count: each call's medians and ratio to one process's, and the Ray side's split."""
    report: dict[str, Any] = {}
    for distributed in rays:
        entry: dict[str, Any] = {}
        for call in CALLS:
            entry[call] = {
                "one_process_median_s": local.median(call),
                "ray_median_s": distributed.median(call),
                "ray_over_one_process": distributed.median(call) / local.median(call),
            }
        method = {"step": "train_step", "adapter": "adapter_files"}
        for call in CALLS:
            phases = task_phases(events, method[call], distributed.samples[call])
            phases["driver_beyond_task"] = distributed.median(call) - phases.get("task", float("nan"))
            entry[call]["ray_split_s"] = phases
        entry["step"]["ray_split_s"]["gradient_exchange"] = exchange[distributed.name]
        report[distributed.name] = entry
    return report


def measure(model_dir: Path, sequences: int, length: int, micro_tokens: int, repeats: int) -> dict:
    """The comparison on a connected Ray cluster, with one torch thread in this process meanwhile."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(model_dir, sequences, length, micro_tokens, repeats)
    finally:
        torch.set_num_threads(threads)


def _measure(model_dir: Path, sequences: int, length: int, micro_tokens: int, repeats: int) -> dict:
    local = Learner(model_dir, learner_config(1, micro_tokens))
    batch = make_batch(local, sequences, length)
    rays = {workers: RayLearner(model_dir, learner_config(workers, micro_tokens)) for workers in (1, 2)}
    try:
        sides = [Side("one_process", local)]
        sides += [Side(f"ray_{workers}_workers", learner) for workers, learner in rays.items()]
        with tempfile.TemporaryDirectory() as work:
            load_before = os.getloadavg()
            puts = run_rounds(sides, batch, repeats, Path(work))
            load_after = os.getloadavg()
        exchange = {
            side.name: max(
                ray.get([w.__ray_call__.remote(_exchange_seconds, 20) for w in side.learner.workers])
            )
            for side in sides[1:]
            if isinstance(side.learner, RayLearner)
        }
        threads = [ray.get(w.__ray_call__.remote(_worker_threads)) for r in rays.values() for w in r.workers]
        time.sleep(2)  # the workers' task events reach the timeline
        events = ray.timeline()
    finally:
        for learner in rays.values():
            learner.close()
    return {
        "sequences": sequences,
        "tokens_per_sequence": length,
        "micro_batches": len(micro_batches_by_token_budget(batch, micro_tokens)),
        "trainable_parameters": sum(parameter.numel() for parameter in local.trainable),
        "batch_pickled_bytes": len(pickle.dumps(ship(batch, None))),
        "batch_put_median_s": statistics.median(puts),
        "one_process_torch_threads": 1,
        "worker_torch_threads": threads,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "workers": compare(sides[0], sides[1:], events, exchange),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a model directory (default: the tiny model, built here)")
    parser.add_argument("--name", default="", help="suffix of the results file")
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--length", type=int, default=96)
    parser.add_argument("--micro-tokens", type=int, default=384)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    out = args.out or RESULTS / (f"ray_overhead-{args.name}.json" if args.name else "ray_overhead.json")
    start_local_cluster(3, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = args.model or build_tiny_model(Path(tmp) / "tiny", seed=0)
            result = measure(model_dir, args.sequences, args.length, args.micro_tokens, args.repeats)
    finally:
        ray.shutdown()
    result.update(
        model=args.name or "tiny",
        repeats=args.repeats,
        command=".venv/bin/python -m bench.ray_overhead " + " ".join(argv),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for name, entry in result["workers"].items():
        print(name, end=":")
        for call in CALLS:
            ray_s, local_s = entry[call]["ray_median_s"], entry[call]["one_process_median_s"]
            print(
                f" {call} {ray_s * 1e3:.1f} ms vs {local_s * 1e3:.1f} ms ({ray_s / local_s:.2f}x)",
                end="",
            )
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
