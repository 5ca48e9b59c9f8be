"""Run an agent app on uvicorn (127.0.0.1, a free port) and write the training config for it."""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import yaml
from starlette.types import ASGIApp

from handlers import serve_in_thread

QUESTIONS = ["name a fruit", "count to five", "describe the sky", "spell a word", "greet me", "pick a colour"]


def serving(app: ASGIApp) -> AbstractContextManager[str]:
    """Serve ``app`` from a background thread; yield its base URL; always stop it."""
    return serve_in_thread(app)


def write_run_files(directory: Path, model_dir: Path, agent_url: str, **fields: Any) -> Path:
    """Rows and a small three-step config in ``directory``; ``fields`` override config fields."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.jsonl").write_text("".join(json.dumps({"question": q}) + "\n" for q in QUESTIONS[:4]))
    (directory / "eval.jsonl").write_text("".join(json.dumps({"question": q}) + "\n" for q in QUESTIONS[4:]))
    config = {
        "model": str(model_dir),
        "engine": "hf",
        "agents": [agent_url],
        "train_file": "train.jsonl",
        "eval_file": "eval.jsonl",
        "num_generations": 4,
        "rows_per_step": 2,
        "max_steps": 3,
        "max_completion_length": 12,
        "temperature": 1.0,
        "learning_rate": 5e-3,
        "lora": {"r": 4, "lora_alpha": 8},
        "eval_steps": None,
        "eval_temperature": 0.0,
        "success_threshold": 0.3,
        "save_steps": 1,
        "save_total_limit": 2,
        "rollout_timeout_s": 120,
        "output_dir": "run",
        "seed": 3,
        **fields,
    }
    path = directory / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path
