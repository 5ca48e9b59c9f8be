"""Where a run's steps spent their time: sampling, update and adapter load, and tokens per second.

Reads a run's ``metrics.jsonl`` (an ``rft train`` output directory, or a demo's run directory with
``grpo/`` in it) and prints one line per step and the medians over the steps that trained:
rollout seconds, sampled tokens and sampled tokens/s (the step's own rollouts: an evaluation's
tokens are left out), update seconds, trained tokens and trained tokens/s, adapter-load seconds,
and the fidelity figures. ``--out`` writes the same as JSON (with ``results.json``'s before/after
when the directory is a demo's).

    .venv/bin/python bench/step_split.py RUN_DIR [--out bench/results/NAME.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

DEMO_KEYS = ("before", "after", "improvement_points", "seconds", "engine")
COLUMNS = (  # title, key, format
    ("step", "step", "d"),
    ("success", "success_rate", ".3f"),
    ("rollout s", "rollout_s", ".1f"),
    ("sampled tok/s", "sampled_tokens_per_s", ".1f"),
    ("update s", "update_s", ".1f"),
    ("trained tok", "trained_tokens", "d"),
    ("trained tok/s", "trained_tokens_per_s", ".1f"),
    ("load s", "adapter_load_s", ".2f"),
    ("|dlogp| mean", "logprob_abs_diff_mean", ".1e"),
)
FIDELITY = ("logprob_abs_diff_mean", "logprob_abs_diff_max", "ratio_min", "ratio_max", "prefix_breaks")


def step_line(record: dict[str, Any]) -> dict[str, Any]:
    """One step's split. The server's sampled-token count of the first step also holds the first
    evaluation's, and that of a step that evaluates its own: such steps are marked."""
    times, tokens, update = record["time_s"], record["tokens"], record["update"]
    sampled = tokens["sample"]
    line = {
        "step": record["step"],
        "counts_evaluation": record["step"] == 1 or "eval" in record,
        "rollouts": record["rollouts"]["total"],
        "success_rate": record["success_rate"],
        "applied": update["applied"],
        "rollout_s": times["rollout"],
        "sampled_tokens": sampled,
        "sampled_tokens_per_s": sampled / times["rollout"] if times["rollout"] else 0.0,
        "update_s": times["update"],
        "trained_tokens": tokens["train"],
        "trained_tokens_per_s": tokens["train"] / times["update"] if update["applied"] else 0.0,
        "adapter_load_s": times.get("adapter_load", 0.0),
        "step_s": times["step"],
    }
    fidelity = record.get("fidelity", {})
    line.update({name: fidelity.get(name) for name in FIDELITY})
    return line


def medians(lines: list[dict[str, Any]]) -> dict[str, float]:
    """Medians of the steps that trained (a step with nothing to train has no update to time);
    sampled tokens/s of those whose count holds no evaluation."""
    trained = [line for line in lines if line["applied"]] or lines
    keys = ("rollout_s", "update_s", "trained_tokens_per_s", "adapter_load_s", "step_s")
    figures = {key: statistics.median(line[key] for line in trained) for key in keys}
    own = [line for line in trained if not line["counts_evaluation"]] or trained
    figures["sampled_tokens_per_s"] = statistics.median(line["sampled_tokens_per_s"] for line in own)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, help="write the split as JSON here")
    args = parser.parse_args(argv)
    grpo = args.run_dir / "grpo" if (args.run_dir / "grpo" / "metrics.jsonl").exists() else args.run_dir
    records = [json.loads(line) for line in (grpo / "metrics.jsonl").read_text().splitlines() if line]
    lines = [step_line(record) for record in records]
    print(" | ".join(title for title, _, _ in COLUMNS))
    for line in lines:
        cells = ("-" if line[key] is None else f"{line[key]:{fmt}}" for _, key, fmt in COLUMNS)
        print(" | ".join(cell.rjust(len(title)) for cell, (title, _, _) in zip(cells, COLUMNS, strict=True)))
    summary = medians(lines)
    print("medians of the steps that trained:", json.dumps({k: round(v, 2) for k, v in summary.items()}))
    if args.out:
        out: dict[str, Any] = {"run_dir": str(args.run_dir), "steps": lines, "medians": summary}
        results = args.run_dir / "results.json"
        if results.exists():
            demo = json.loads(results.read_text())
            out.update({key: demo[key] for key in DEMO_KEYS})
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
