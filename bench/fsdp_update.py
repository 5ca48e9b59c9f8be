"""Benchmark: a learner update sharded with FSDP2 over two CPU learner processes against the same
update unsharded in one learner process, and what each process holds.

Both learners are :class:`trainer.learner.processes.ProcessLearner` (the same command channel, the
same worker body): one process with ``learner.shard: off`` and two processes with ``learner.shard:
fsdp`` (gloo), every process with one torch thread (``OMP_NUM_THREADS=1``: on cores other jobs
share, OpenMP's spinning threads made a two-thread step many times slower). They stay alive side by
side and run the same batch in turn (``--runs`` alternations). Two figures: the ratio of the wall
medians (two processes have two cores against one, when the cores are free) and the ratio of the CPU
seconds a step costs, all ranks together, to the unsharded step's: the sharding's overhead (all-gathers
of every decoder layer forward and backward, reduce-scatters of the LoRA gradients), whatever the
machine's load. Each process's peak
resident memory (``VmHWM``) and its resident memory once loaded and after the first step (``VmRSS``)
show what each holds: a sharded rank holds half the weights, plus what gathering costs.

    .venv/bin/python -m bench.fsdp_update [--model DIR --name NAME] [--sequences 8] [--length 64] [--runs 5]
        [--fixed-mmap-threshold]

Without ``--model`` it uses SmolLM2-135M from the cache (``policy_server.models.smollm2``). Results
go to ``bench/results/fsdp_update[-NAME].json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from policy_server.models.smollm2 import cached_smollm2
from trainer.algo.sequences import TrainingSequence
from trainer.config import TrainConfig
from trainer.learner.processes import ProcessLearner

RESULTS = Path(__file__).resolve().parent / "results"


def learner_config(processes: int, shard: str, micro_tokens: int) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "learning_rate": 1e-4,
            "max_steps": 1000,
            "lora": {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0},
            "learner": {"device": "cpu", "dtype": "float32", "processes": processes, "shard": shard},
            "max_tokens_per_microbatch": micro_tokens,
        }
    )


def batch(vocab: int, count: int, length: int) -> list[TrainingSequence]:
    """``count`` sequences of ``length`` tokens, the second half sampled, two per episode."""
    rng = random.Random(0)
    sequences = []
    for index in range(count):
        ids = [rng.randrange(vocab) for _ in range(length)]
        mask = [0] * (length // 2) + [1] * (length - length // 2)
        sequences.append(
            TrainingSequence(
                rollout_id=f"episode-{index // 2}",
                token_ids=ids,
                loss_mask=mask,
                behavior_logprobs=[-2.0 * m for m in mask],
                advantage=1.0 if index % 2 else -1.0,
                num_calls=1,
            )
        )
    return sequences


def memory(pid: int) -> dict[str, float]:
    """The process's resident and peak resident memory, MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) / 1024
    return fields


def cpu_seconds(pid: int) -> float:
    """User and system CPU time the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--name", default="")
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--fixed-mmap-threshold", action="store_true", help="MALLOC_MMAP_THRESHOLD_=131072")
    args = parser.parse_args()
    model = args.model or cached_smollm2()
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    sequences = batch(vocab, args.sequences, args.length)
    micro_tokens = 2 * args.length  # two sequences a micro-batch: four micro-batches, two per rank
    os.environ["OMP_NUM_THREADS"] = "1"  # the learner processes' torch threads
    if args.fixed_mmap_threshold:
        # glibc's fixed mmap threshold: freed buffers (a gathered layer, gloo's) go back to the system
        # at once, so resident memory counts live tensors rather than what glibc keeps for reuse
        # after raising its dynamic threshold; every such buffer is then an mmap and munmap.
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    learners = {
        "unsharded_1_process": ProcessLearner(model, learner_config(1, "off", micro_tokens)),
        "fsdp_2_processes": ProcessLearner(model, learner_config(2, "fsdp", micro_tokens)),
    }
    try:
        loaded = {name: [memory(pid)["VmRSS"] for pid in learner.pids] for name, learner in learners.items()}
        seconds: dict[str, list[float]] = {name: [] for name in learners}
        cpu: dict[str, list[float]] = {name: [] for name in learners}
        warm: dict[str, list[float]] = {}
        for run in range(args.runs + 1):  # the first alternation warms up and is not counted
            for name, learner in learners.items():
                used = sum(cpu_seconds(pid) for pid in learner.pids)
                started = time.perf_counter()
                learner.train_step(sequences, seed=run)
                if not run:
                    warm[name] = [memory(pid)["VmRSS"] for pid in learner.pids]
                if run:
                    seconds[name].append(time.perf_counter() - started)
                    cpu[name].append(sum(cpu_seconds(pid) for pid in learner.pids) - used)
        peak = {name: [memory(pid)["VmHWM"] for pid in learner.pids] for name, learner in learners.items()}
    finally:
        for learner in learners.values():
            learner.close()
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    cpu_medians = {name: statistics.median(values) for name, values in cpu.items()}
    result: dict[str, Any] = {
        "command": "PYTHONPATH=. .venv/bin/python -m bench.fsdp_update " + " ".join(sys.argv[1:]),
        "model": str(model),
        "sequences": args.sequences,
        "length": args.length,
        "micro_batch_tokens": micro_tokens,
        "fixed_mmap_threshold": args.fixed_mmap_threshold,
        "runs": args.runs,
        "step_seconds": seconds,
        "step_median_s": medians,
        "wall_ratio": medians["fsdp_2_processes"] / medians["unsharded_1_process"],
        "step_cpu_seconds": cpu,
        "step_cpu_median_s": cpu_medians,
        "cpu_overhead_ratio": cpu_medians["fsdp_2_processes"] / cpu_medians["unsharded_1_process"],
        "load_average_1min": os.getloadavg()[0],  # other jobs on the same cores
        "rss_loaded_mb": loaded,
        "rss_after_first_step_mb": warm,
        "rss_peak_mb": peak,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"fsdp_update{'-' + args.name if args.name else ''}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
