"""The demo's GRPO stage as a ``rft train`` config (:func:`train_config`), and that config written
for a user to rerun the stage with ``rft train`` against an agent on the default port."""

from __future__ import annotations

from pathlib import Path

import yaml

from agents.maze.demo.plans import RAY_SECTION, DemoPlan
from trainer.config import TrainConfig

AGENT_PORT_FOR_RERUN = 8080


def train_config(
    plan: DemoPlan,
    *,
    model_dir: Path,
    init_adapter: Path,
    data_dir: Path,
    output_dir: Path,
    agent_url: str,
    engine: str,
    target_modules: list[str],
    seed: int,
    chat_template: str | None = None,
    ray: bool = False,
) -> TrainConfig:
    """The GRPO run of the demo, as a ``rft train`` config; ``ray``: on a local Ray cluster."""
    from agents.maze.dataset import TRAIN_FILE, VALIDATION_FILE

    return TrainConfig.model_validate(
        {
            "model": str(model_dir),
            "chat_template": chat_template,
            "engine": engine,
            "init_adapter": str(init_adapter),
            "lora": {
                "r": plan.lora_r,
                "lora_alpha": plan.lora_alpha,
                "target_modules": target_modules,
                "adapt_vision": plan.adapt_vision,
            },
            "train_file": str(data_dir / TRAIN_FILE),
            "eval_file": str(data_dir / VALIDATION_FILE),
            "max_eval_rows": plan.eval_rows,
            "agents": [agent_url],
            "num_generations": plan.num_generations,
            "rows_per_step": plan.rows_per_step,
            "max_steps": plan.grpo_steps,
            "num_iterations": plan.num_iterations,
            "learning_rate": plan.learning_rate,
            "lr_scheduler_type": "constant_with_warmup",
            "warmup_steps": plan.warmup_steps,
            "loss_type": plan.loss_type,
            "beta": plan.beta,
            "temperature": 1.0,
            "eval_temperature": 1.0,
            "eval_generations": plan.eval_generations,
            "eval_steps": None,
            "success_threshold": 0.5,
            "max_completion_length": 64,
            "max_tokens_per_microbatch": plan.max_tokens_per_microbatch,
            "max_calls_per_rollout": 32,
            # Generous: on a machine shared with other work a rollout that times out is a failure, and
            # the run would no longer give the same numbers as on an idle one.
            "rollout_timeout_s": 900.0,
            "save_steps": plan.grpo_steps,
            "save_total_limit": 1,
            "output_dir": str(output_dir),
            "run_name": output_dir.parent.name,
            "seed": seed,
            "ray": RAY_SECTION if ray else None,
        }
    )


def write_rerun_config(config: TrainConfig, path: Path) -> None:
    """The GRPO config as YAML, pointed at an agent on the default port, for ``rft train``."""
    data = config.model_dump(mode="json", exclude_none=True)
    data["agents"] = [f"http://127.0.0.1:{AGENT_PORT_FOR_RERUN}"]
    data["output_dir"] = str(Path(data["output_dir"]).with_name("rerun"))
    header = (
        "# The demo's GRPO run. To rerun it: start the agent (python -m agents.maze.main, port 8080),\n"
        f"# then: rft train {path}\n"
    )
    path.write_text(header + yaml.safe_dump(data, sort_keys=False))
