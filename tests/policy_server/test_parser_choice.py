"""Which tool-call and reasoning parsers an engine uses: ``auto`` (the default) is the model family's,
an explicit setting wins (null: none), and ``auto`` for a model no family covers stops with a sentence
naming its model_type and the settings to give. One function (``families.resolve_parsers``) decides
for the vllm engine, the hf engine, ``rft serve`` and ``rft train``."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from policy_server.cli import _engine, _parser
from policy_server.engines.hf import HFEngine
from policy_server.models.families import (
    Parsers,
    UnknownFamilyError,
    family,
    parsing_family,
    resolve_parsers,
)
from trainer.config import TrainConfig
from trainer.engine import engine_parsers
from trainer.errors import TrainingError

UNKNOWN = r"model_type 'phi3', which no model family rftkit knows covers .* set vllm.tool_call_parser and "


def _names(parsers: Parsers) -> tuple[str | None, str | None]:
    return parsers.tool_call, parsers.reasoning


@pytest.fixture
def phi3_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "phi3"}))
    return tmp_path


def _qwen3_config(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe"}))
    return path


def test_auto_is_the_model_familys_parsers(tiny_model_dir: Path, tmp_path: Path) -> None:
    qwen3 = resolve_parsers(_qwen3_config(tmp_path / "qwen3"))
    assert (qwen3.tool_call, qwen3.reasoning, qwen3.family) == ("hermes", "qwen3", family("qwen3"))
    llama = resolve_parsers(tiny_model_dir)
    assert (llama.tool_call, llama.reasoning, llama.family) == ("hermes", None, family("llama"))


def test_an_explicit_setting_wins_and_null_is_none(tmp_path: Path) -> None:
    model = _qwen3_config(tmp_path / "qwen3")
    assert _names(resolve_parsers(model, "llama3_json", None)) == ("llama3_json", None)
    assert _names(resolve_parsers(model, None, "auto")) == (None, "qwen3")


def test_auto_for_a_model_no_family_covers_names_its_model_type_and_the_settings(phi3_dir: Path) -> None:
    with pytest.raises(UnknownFamilyError, match=UNKNOWN + "vllm.reasoning_parser"):
        resolve_parsers(phi3_dir)
    with pytest.raises(UnknownFamilyError, match="--tool-call-parser and --reasoning-parser"):
        resolve_parsers(phi3_dir, "hermes", "auto")
    given = resolve_parsers(phi3_dir, "hermes", None)
    assert (given.tool_call, given.reasoning, given.family) == ("hermes", None, None)


def test_the_hf_engine_parses_as_the_family_whose_parser_is_named(phi3_dir: Path, tmp_path: Path) -> None:
    qwen3 = _qwen3_config(tmp_path / "qwen3")
    assert parsing_family(resolve_parsers(qwen3)) is family("qwen3")
    # A model of no family, told hermes, parses as the first family using hermes.
    assert parsing_family(resolve_parsers(phi3_dir, "hermes", None)) is family("llama")
    assert parsing_family(resolve_parsers(qwen3, None, None)) is family("qwen3")  # no tool parsing
    with pytest.raises(UnknownFamilyError, match="no family uses vLLM's 'llama3_json' parser; set vllm.tool"):
        parsing_family(resolve_parsers(qwen3, "llama3_json", None))


def test_the_hf_engine_refuses_at_start_what_it_cannot_parse(phi3_dir: Path, tiny_model_dir: Path) -> None:
    with pytest.raises(UnknownFamilyError, match=UNKNOWN):
        asyncio.run(HFEngine(phi3_dir).start())
    with pytest.raises(UnknownFamilyError, match="'llama3_json'"):
        asyncio.run(HFEngine(tiny_model_dir, tool_call_parser="llama3_json").start())


def test_the_hf_engine_with_no_tool_parser_leaves_calls_in_the_text(tiny_model_dir: Path) -> None:
    engine = HFEngine(tiny_model_dir, tool_call_parser=None)

    async def loaded() -> bool:
        await engine.start()
        try:
            return engine._parse_tools
        finally:
            await engine.close()

    assert asyncio.run(loaded()) is False


def test_rft_serve_resolves_the_same_way(phi3_dir: Path, tmp_path: Path) -> None:
    qwen3 = _qwen3_config(tmp_path / "qwen3")
    vllm = ["--engine", "vllm", "--vllm-python", sys.executable]
    command = _engine(_parser().parse_args(["--model", str(qwen3), *vllm])).command(8000)  # type: ignore[attr-defined]
    assert command[command.index("--tool-call-parser") + 1] == "hermes"
    assert command[command.index("--reasoning-parser") + 1] == "qwen3"
    told = ["--tool-call-parser", "none", "--reasoning-parser", "none"]
    bare = _engine(_parser().parse_args(["--model", str(qwen3), *vllm, *told])).command(8000)  # type: ignore[attr-defined]
    assert "--tool-call-parser" not in bare and "--reasoning-parser" not in bare
    with pytest.raises(UnknownFamilyError, match=UNKNOWN):
        _engine(_parser().parse_args(["--model", str(phi3_dir)]))


def test_a_run_resolves_before_anything_loads(phi3_dir: Path, tmp_path: Path) -> None:
    assert _names(engine_parsers(TrainConfig(), _qwen3_config(tmp_path / "qwen3"))) == ("hermes", "qwen3")
    with pytest.raises(TrainingError, match=UNKNOWN):
        engine_parsers(TrainConfig(), phi3_dir)
    explicit = TrainConfig(
        engine="vllm", vllm={"tool_call_parser": "phi4_mini_json", "reasoning_parser": None}
    )
    assert _names(engine_parsers(explicit, phi3_dir)) == ("phi4_mini_json", None)
    with pytest.raises(TrainingError, match="no family uses vLLM's 'phi4_mini_json' parser"):
        engine_parsers(explicit.model_copy(update={"engine": "hf"}), phi3_dir)
