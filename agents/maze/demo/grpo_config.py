"""The demos' GRPO stage as a ``rft train`` config: the fields every demo sets alike from its plan
(:func:`grpo_fields`, the maze's and Wordle's), the maze's own (:func:`train_config`), and the config
written for a user to rerun the stage with ``rft train`` against the agent on the default port."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import yaml

from agents.maze.demo.plans import RAY_SECTION, DemoPlan
from trainer.config import TrainConfig

AGENT_PORT_FOR_RERUN = 8080
MAZE_AGENT = "agents.maze.main"


class GrpoPlan(Protocol):
    """The GRPO and evaluation sizes a demo's plan gives (the maze's and Wordle's plans both do)."""

    @property
    def eval_rows(self) -> int: ...
    @property
    def num_generations(self) -> int: ...
    @property
    def rows_per_step(self) -> int: ...
    @property
    def grpo_steps(self) -> int: ...
    @property
    def num_iterations(self) -> int: ...
    @property
    def learning_rate(self) -> float: ...
    @property
    def warmup_steps(self) -> int: ...
    @property
    def loss_type(self) -> str: ...
    @property
    def beta(self) -> float: ...
    @property
    def eval_generations(self) -> int: ...
    @property
    def max_tokens_per_microbatch(self) -> int: ...
    @property
    def lora_r(self) -> int: ...
    @property
    def lora_alpha(self) -> float: ...


def grpo_fields(
    plan: GrpoPlan,
    *,
    model_dir: Path,
    init_adapter: Path,
    train_file: Path,
    eval_file: Path,
    output_dir: Path,
    agent_url: str,
    engine: str,
    target_modules: list[str],
    seed: int,
    chat_template: str | None,
) -> dict[str, Any]:
    """What every demo's GRPO run sets alike, from its plan; a demo adds its task's own fields."""
    return {
        "model": str(model_dir),
        "chat_template": chat_template,
        "engine": engine,
        "init_adapter": str(init_adapter),
        "lora": {"r": plan.lora_r, "lora_alpha": plan.lora_alpha, "target_modules": target_modules},
        "train_file": str(train_file),
        "eval_file": str(eval_file),
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
        "eval_generations": plan.eval_generations,
        "eval_steps": None,
        "max_tokens_per_microbatch": plan.max_tokens_per_microbatch,
        # Generous: on a machine shared with other work a rollout that times out is a failure, and
        # the run would no longer give the same numbers as on an idle one.
        "rollout_timeout_s": 900.0,
        "save_steps": plan.grpo_steps,
        "save_total_limit": 1,
        "output_dir": str(output_dir),
        "run_name": output_dir.parent.name,
        "seed": seed,
    }


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
    """The GRPO run of the maze demo, as a ``rft train`` config; ``ray``: on a local Ray cluster."""
    from agents.maze.dataset import TRAIN_FILE, VALIDATION_FILE

    fields = grpo_fields(
        plan,
        model_dir=model_dir,
        init_adapter=init_adapter,
        train_file=data_dir / TRAIN_FILE,
        eval_file=data_dir / VALIDATION_FILE,
        output_dir=output_dir,
        agent_url=agent_url,
        engine=engine,
        target_modules=target_modules,
        seed=seed,
        chat_template=chat_template,
    )
    fields["lora"]["adapt_vision"] = plan.adapt_vision
    fields.update(
        temperature=1.0,
        eval_temperature=1.0,
        success_threshold=0.5,
        max_completion_length=64,
        max_calls_per_rollout=32,
        ray=RAY_SECTION if ray else None,
    )
    return TrainConfig.model_validate(fields)


def write_rerun_config(
    config: TrainConfig, path: Path, *, demo: str = "demo", agent_module: str = MAZE_AGENT
) -> None:
    """The GRPO config as YAML, pointed at the agent on the default port, for ``rft train``."""
    data = config.model_dump(mode="json", exclude_none=True)
    data["agents"] = [f"http://127.0.0.1:{AGENT_PORT_FOR_RERUN}"]
    data["output_dir"] = str(Path(data["output_dir"]).with_name("rerun"))
    header = (
        f"# The {demo}'s GRPO run. To rerun it: start the agent (python -m {agent_module}, port "
        f"{AGENT_PORT_FOR_RERUN}),\n# then: rft train {path}\n"
    )
    path.write_text(header + yaml.safe_dump(data, sort_keys=False))
