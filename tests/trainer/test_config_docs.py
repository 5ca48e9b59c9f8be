"""The command line docs/config.md shows is one `rft train` accepts, with the values it says."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from trainer.cli import _overrides, build_parser
from trainer.config import EXAMPLE_COMMAND, load_config

REPO = Path(__file__).resolve().parents[2]


def test_the_documented_override_command_parses_and_applies(tmp_path: Path) -> None:
    assert EXAMPLE_COMMAND in (REPO / "docs" / "config.md").read_text()
    program, command, *argv = shlex.split(EXAMPLE_COMMAND)
    assert (program, command) == ("rft", "train")
    args = build_parser().parse_args(argv)
    config_file = tmp_path / args.config
    config_file.write_text(yaml.safe_dump({"agents": ["http://x:8080"], "train_file": "rows.jsonl"}))
    (tmp_path / "rows.jsonl").write_text('{"q": 1}\n')
    config = load_config(config_file, _overrides(args))
    assert config.lora.r == 8
    assert config.agents == ["http://a:8080", "http://b:8080"]
