"""The learner's update on the tiny gpt-oss with transformers' eager attention and with rftkit's
chunked attention (``rftkit_chunked``, what the family trains with), alternating on the same learner
and batch: seconds per ``train_step``, and on CUDA the peak memory allocated.

    .venv/bin/python bench/attention_step.py [--device cpu] [--threads 1] [--rounds 3] \
        [--out bench/results/attention_step.json]

The batch: six sequences of 300 to 600 tokens (past the 128-token window, over several query blocks),
100 prompt tokens each, LoRA r=4 on the attention projections.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

LENGTHS = (500, 450, 400, 350, 300, 600)
PROMPT = 100
ATTENTIONS = ("eager", "rftkit_chunked")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steadier timings)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "attention_step.json")
    args = parser.parse_args(argv)

    import torch

    from policy_server.models.families import family
    from trainer.algo.sequences import TrainingSequence
    from trainer.config import TrainConfig
    from trainer.learner.learner import Learner

    torch.set_num_threads(args.threads)
    model_dir = family("gpt_oss").build_tiny(Path(tempfile.mkdtemp()) / "model")
    config = TrainConfig.model_validate({"lora": {"r": 4}, "learner": {"device": args.device}})
    learner = Learner(model_dir, config)
    rng, vocab = random.Random(0), learner.model.config.vocab_size
    sequences = [
        TrainingSequence(
            rollout_id=f"r{index}",
            token_ids=[rng.randrange(vocab) for _ in range(length)],
            loss_mask=[0] * PROMPT + [1] * (length - PROMPT),
            behavior_logprobs=[0.0] * PROMPT + [-5.0] * (length - PROMPT),
            advantage=1.0 if index % 2 else -1.0,
            num_calls=1,
        )
        for index, length in enumerate(LENGTHS)
    ]
    base = learner.model.get_base_model()
    seconds: dict[str, list[float]] = {name: [] for name in ATTENTIONS}
    peaks: dict[str, list[float]] = {name: [] for name in ATTENTIONS}
    cuda = args.device.startswith("cuda")
    for _ in range(args.rounds):
        for name in ATTENTIONS:
            base.set_attn_implementation(name)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            started = time.perf_counter()
            learner.train_step(sequences, seed=0)
            if cuda:
                torch.cuda.synchronize()
                peaks[name].append(torch.cuda.max_memory_allocated() / 1e9)
            seconds[name].append(time.perf_counter() - started)
    result = {
        "device": args.device,
        "threads": args.threads,
        "tokens": sum(LENGTHS),
        "seconds": seconds,
        "median_s": {name: statistics.median(values) for name, values in seconds.items()},
        "peak_allocated_gb": peaks if cuda else None,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["median_s"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
