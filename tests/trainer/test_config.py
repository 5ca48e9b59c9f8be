"""TrainConfig: YAML and TOML loading, defaults, CLI overrides, error messages, the reference page."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from trainer.config import ConfigError, TrainConfig, load_config, render_markdown

REPO_ROOT = Path(__file__).resolve().parents[2]
ARN = "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/wordle-abc123"

YAML_TEXT = f"""
model: ./base
engine: vllm
vllm:
  max_lora_rank: 32
  extra_args: [--dtype, float32]
lora:
  r: 8
  lora_alpha: 16
  target_modules: [q_proj, v_proj]
train_file: data/train.jsonl
eval_file: data/val.jsonl
agents:
  - http://127.0.0.1:9001/
  - {ARN}
num_generations: 4
rows_per_step: 2
loss_type: grpo
scale_rewards: false
reward_aggregation: last
output_dir: runs/one
prices:
  train: 0.5
"""

TOML_TEXT = f"""
model = "./base"
engine = "vllm"
train_file = "data/train.jsonl"
eval_file = "data/val.jsonl"
agents = ["http://127.0.0.1:9001/", "{ARN}"]
num_generations = 4
rows_per_step = 2
loss_type = "grpo"
scale_rewards = false
reward_aggregation = "last"
output_dir = "runs/one"

[vllm]
max_lora_rank = 32
extra_args = ["--dtype", "float32"]

[lora]
r = 8
lora_alpha = 16
target_modules = ["q_proj", "v_proj"]

[prices]
train = 0.5
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / "configs" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("name", "text"), [("run.yaml", YAML_TEXT), ("run.yml", YAML_TEXT), ("run.toml", TOML_TEXT)]
)
def test_yaml_and_toml_load_the_same_config(tmp_path: Path, name: str, text: str) -> None:
    config_dir = tmp_path / "configs"
    (config_dir / "base").mkdir(parents=True)
    config = load_config(_write(tmp_path, name, text))

    assert config.model == str(config_dir / "base")
    assert config.engine == "vllm"
    assert config.vllm.max_lora_rank == 32
    assert config.vllm.extra_args == ["--dtype", "float32"]
    assert (config.lora.r, config.lora.lora_alpha, config.lora.target_modules) == (
        8,
        16.0,
        ["q_proj", "v_proj"],
    )
    assert config.train_file == config_dir / "data" / "train.jsonl"
    assert config.eval_file == config_dir / "data" / "val.jsonl"
    assert config.output_dir == config_dir / "runs" / "one"
    assert config.agents == ["http://127.0.0.1:9001", ARN]
    assert (config.num_generations, config.rows_per_step, config.loss_type) == (4, 2, "grpo")
    assert config.scale_rewards == "none"
    assert config.reward_aggregation == "last"
    assert (config.prices.prefill, config.prices.sample, config.prices.train) == (0.12, 0.30, 0.5)


def test_defaults(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, "empty.yaml", ""))
    assert config.engine == "hf"
    assert config.model is None
    assert config.num_generations == 8
    assert config.loss_type == "dapo"
    assert config.scale_rewards == "group"
    assert config.beta == 0.0
    assert config.epsilon_high is None and config.epsilon == 0.2
    assert config.reward_aggregation == "sum"
    assert (config.prices.prefill, config.prices.sample, config.prices.train) == (0.12, 0.30, 0.36)
    assert config.train_file == tmp_path / "configs" / "train.jsonl"
    assert config.mlflow_uri == (tmp_path / "configs" / "runs" / "rftkit" / "mlruns").as_uri()
    assert config.eval_file is None and not config.vllm_importance_sampling_correction
    assert (config.vllm_importance_sampling_mode, config.vllm_importance_sampling_cap) == (
        "token_truncate",
        3.0,
    )
    assert config.use_bias_correction_kl is False


def test_the_old_truncated_importance_cap_names_its_trl_replacement(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="vllm_importance_sampling_cap: 2.0"):
        load_config(_write(tmp_path, "old.yaml", "truncated_importance_cap: 2.0\n"))


def test_hub_id_model_is_not_turned_into_a_path(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, "hub.yaml", "model: Qwen/Qwen3-0.6B\n"))
    assert config.model == "Qwen/Qwen3-0.6B"


def test_overrides_parse_yaml_scalars_into_nested_fields(tmp_path: Path) -> None:
    path = _write(tmp_path, "run.yaml", YAML_TEXT)
    (path.parent / "base").mkdir()
    config = load_config(
        path,
        [
            "lora.r=4",
            "learning_rate=1e-4",
            "epsilon_high=0.28",
            "eval_steps=null",
            "agents=[http://a:1, http://b:2]",
            "lora.target_modules=all-linear",
            "policy_server.public_url=https://tunnel.example.com/",
            "shuffle=false",
        ],
    )
    assert config.lora.r == 4
    assert config.learning_rate == 1e-4
    assert config.epsilon_high == 0.28
    assert config.eval_steps is None
    assert config.agents == ["http://a:1", "http://b:2"]
    assert config.lora.target_modules == "all-linear"
    assert config.policy_server.public_url == "https://tunnel.example.com"
    assert config.shuffle is False


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["lora.r=0"], "lora.r: Input should be greater than 0"),
        (["num_generations=1"], "num_generations: Input should be greater than or equal to 2"),
        (["loss_type=ppo"], "loss_type: Input should be 'grpo', 'dr_grpo', 'dapo', 'gspo' or 'cispo'"),
        (["engine=sglang"], "engine: Input should be 'hf' or 'vllm'"),
        (["lora.lora_dropout=1.5"], "lora.lora_dropout: Input should be less than 1"),
        (["lora.target_modules=[]"], "lora.target_modules: list at least one module name"),
        (["rollout_timeout_s=-1"], "rollout_timeout_s: Input should be greater than 0"),
        (["agents=[]"], "agents: List should have at least 1 item"),
        (["agents=[ftp://x]"], "agents: 'ftp://x' is neither an http(s) URL nor an AgentCore runtime ARN"),
        (["reward_aggregation=max"], "reward_aggregation: Input should be 'sum', 'last' or 'mean'"),
        (["top_p=0"], "top_p: Input should be greater than 0"),
        (["prices.train=-1"], "prices.train: Input should be greater than or equal to 0"),
        (["vllm.attach_url=localhost:8000"], "vllm.attach_url: must be an http:// or https:// URL"),
        (
            ["num_generation=4"],
            "num_generation: Extra inputs are not permitted (did you mean 'num_generations'?)",
        ),
        (["lora.rank=4"], "lora.rank: Extra inputs are not permitted"),
        (
            ["importance_sampling_level=sequence"],
            "importance_sampling_level: Extra inputs are not permitted (did you mean 'loss_type'?)",
        ),
        (["epsilon_high=0.1"], "epsilon_high (0.1) must be at least epsilon (0.2)"),
        (["loss_type=cispo"], "set epsilon_high, e.g. 5.0 as ScaleRL"),
        (
            ["engine=vllm", "vllm.max_lora_rank=64", "lora.r=128"],
            "vllm.max_lora_rank (64) must be at least lora.r (128)",
        ),
        (["max_steps=abc"], "max_steps: Input should be a valid integer"),
        (["policy_server.gateway_workers=2"], "policy_server.gateway_workers > 1 needs engine: vllm"),
        (["policy_server.gateway_workers=0"], "policy_server.gateway_workers: Input should be greater"),
    ],
)
def test_validation_errors_name_the_field(tmp_path: Path, overrides: list[str], expected: str) -> None:
    path = _write(tmp_path, "ok.yaml", "agents: [http://127.0.0.1:9001]\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, overrides)
    assert expected in str(caught.value)


def test_every_bad_field_is_listed(tmp_path: Path) -> None:
    path = _write(tmp_path, "bad.toml", 'beta = -1\n[lora]\nr = "x"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path, ["max_retries=-2"])
    message = str(caught.value)
    assert "3 problems" in message
    for line in (
        "beta: Input should be greater than or equal to 0",
        "lora.r: Input should be a valid integer",
        "max_retries: Input should be greater than or equal to 0",
    ):
        assert line in message


@pytest.mark.parametrize(
    ("name", "text", "overrides", "expected"),
    [
        ("missing.yaml", None, [], "does not exist"),
        ("run.json", "{}", [], "must end in .yaml, .yml or .toml"),
        ("broken.yaml", "lora: [unclosed\n", [], "is not valid YAML"),
        ("broken.toml", "lora = \n", [], "is not valid TOML"),
        ("list.yaml", "- a\n- b\n", [], "must hold a mapping of fields, not list"),
        ("ok.yaml", "seed: 1\n", ["lora.r"], "must look like key=value"),
        ("ok.yaml", "seed: 1\n", ["seed.value=3"], "seed is not a section"),
    ],
)
def test_file_and_override_errors(
    tmp_path: Path, name: str, text: str | None, overrides: list[str], expected: str
) -> None:
    path = tmp_path / name if text is None else _write(tmp_path, name, text)
    with pytest.raises(ConfigError, match=expected):
        load_config(path, overrides)


def test_every_field_is_documented() -> None:
    sections = [TrainConfig] + [
        field.annotation
        for field in TrainConfig.model_fields.values()
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
    ]
    assert len(sections) == 11  # TrainConfig and its sections (ray, optional, is not counted)
    for section in sections:
        for name, field in section.model_fields.items():
            assert field.description, f"{section.__name__}.{name} has no description"
            assert not field.is_required(), f"{section.__name__}.{name} has no default"


def test_reference_page_is_up_to_date() -> None:
    generated = subprocess.run(
        [sys.executable, "-m", "trainer.config", "--markdown"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert generated == render_markdown()
    assert (REPO_ROOT / "docs" / "config.md").read_text() == generated, (
        "docs/config.md is stale: run `python -m trainer.config --markdown > docs/config.md`"
    )
    for name in TrainConfig.model_fields:
        assert f"`{name}" in generated
    assert "| `lora.r` | int | `16` |" in generated
