"""docs/sft.md's path from "my agent" to a first warm start (issue 50.10): the teacher run's settings
are a valid run config that keeps every episode of its one step, and each command of the path is one
that `rft` takes as written."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from agents.letters.run_files import write_run_files
from trainer import cli as train_cli
from trainer.config import load_config
from trainer.sft.cli import build_parser

REPO_ROOT = Path(__file__).resolve().parents[2]


def section() -> str:
    text = (REPO_ROOT / "docs" / "sft.md").read_text()
    return text.split("## Demonstrations from your agent\n", 1)[1].split("\n## ", 1)[0]


def test_the_teacher_run_keeps_every_episode_of_its_one_step(tiny_model_dir: Path, tmp_path: Path) -> None:
    (block,) = re.findall(r"```yaml\n(.*?)```", section(), re.DOTALL)
    fields = yaml.safe_load(block)
    fields["model"] = str(tiny_model_dir)  # the teacher: any local model directory
    config = load_config(write_run_files(tmp_path, tiny_model_dir, "http://127.0.0.1:9", **fields))
    assert config.max_steps == 1
    assert config.transcripts.per_step >= config.rows_per_step * config.num_generations


def test_each_command_of_the_path_is_one_rft_takes(tmp_path: Path) -> None:
    commands = [
        shlex.split(line.strip())
        for block in re.findall(r"```bash\n(.*?)```", section(), re.DOTALL)
        for line in block.splitlines()
        if line.strip()
    ]
    assert [command[:2] for command in commands] == [["rft", "show"], ["rft", "sft"], ["rft", "train"]]
    show, sft, train = commands
    assert show[3:] == ["--export-demos", "demos.jsonl", "--min-reward", "1.0"]
    args = build_parser().parse_args(sft[2:])
    assert args.data == Path(show[4]) and args.steps == 200
    assert train_cli.build_parser().parse_args(train[2:]).overrides == [f"init_adapter={args.out}"]
    assert "`rft collect --teacher`" in section() and "(distillation.md)" in section()
