"""Per-step fidelity figures (docs/fidelity.md) of the letters agent's 3-step run on the tiny model.

The run of ``tests/trainer/test_train_integration.py`` (hf engine) or, with ``--engine vllm``, the same
run sampled by vLLM fp32 with two gateway workers (``RFTKIT_VLLM_PYTHON`` names the interpreter that has
vLLM). Prints each step's ``fidelity`` section and writes them to
``--json``.

    PYTHONPATH=. .venv/bin/python bench/fidelity_figures.py OUT_DIR [--engine vllm] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from agents.letters.main import app
from agents.letters.run_files import serving, write_run_files
from policy_server.models.tiny import build_tiny_model
from trainer.config import load_config
from trainer.loop import train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="an empty directory for the model and the run")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    model = build_tiny_model(args.out / "model", seed=0)
    fields: dict[str, object] = {}
    if args.engine == "vllm":
        fields = {
            "engine": "vllm",
            "vllm": {"python": os.environ["RFTKIT_VLLM_PYTHON"], "dtype": "float32", "max_lora_rank": 8},
            "policy_server": {"gateway_workers": 2},
            "eval_file": None,
        }
    with serving(app) as url:
        config = load_config(write_run_files(args.out / "run", model, url, **fields))
        train(config)
    steps = []
    for line in (config.output_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        steps.append(
            {"step": record["step"], "mismatch_kl": record["update"]["mismatch_kl"], **record["fidelity"]}
        )
        print(json.dumps(steps[-1]))
    if args.json is not None:
        args.json.write_text(
            json.dumps({"engine": args.engine, "dtype": "float32", "steps": steps}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
