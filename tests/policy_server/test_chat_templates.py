"""The ``chat_template`` setting: one template for both engines and the learner, named or from a file."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from jinja2 import Template

from policy_server.engines.base import GenerationRequest
from policy_server.engines.hf import HFEngine
from policy_server.engines.vllm import VLLMEngine
from policy_server.models.chat_templates import ChatTemplateError, chat_template_path, load_tokenizer
from policy_server.models.tiny import CHAT_TEMPLATE
from trainer.config import ConfigError, load_config

MARKED = "MARK{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def test_the_shipped_template_is_the_tiny_models_own(tiny_model_dir: Path) -> None:
    assert chat_template_path("chatml-tools").read_text().strip() == CHAT_TEMPLATE
    assert load_tokenizer(tiny_model_dir).chat_template == CHAT_TEMPLATE


def test_an_unknown_template_names_the_shipped_ones(tmp_path: Path) -> None:
    with pytest.raises(
        ChatTemplateError, match="neither a shipped template \\(chatml-tools, chatml-tools-vision, "
    ):
        chat_template_path("chatml-tool")
    with pytest.raises(ChatTemplateError, match="nor a readable file"):
        HFEngine(tmp_path, chat_template=str(tmp_path / "missing.jinja"))


def test_the_hf_engine_renders_prompts_with_the_setting(tiny_model_dir: Path, tmp_path: Path) -> None:
    template = tmp_path / "marked.jinja"
    template.write_text(MARKED)

    async def prompt_text() -> str:
        engine = HFEngine(tiny_model_dir, chat_template=str(template))
        await engine.start()
        try:
            request = GenerationRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=1)
            result = await engine.generate(request)
        finally:
            await engine.close()
        return load_tokenizer(tiny_model_dir).decode(result.prompt_token_ids)

    assert asyncio.run(prompt_text()).startswith("MARK<|im_start|>user\nhi")


def test_vllm_gets_the_template_and_the_parsers_on_its_command_line() -> None:
    engine = VLLMEngine(
        "/models/qwen3",
        python=sys.executable,
        chat_template="chatml-tools",
        tool_call_parser="llama3_json",
        reasoning_parser="qwen3",
    )
    command = engine.command(8000)
    assert command[command.index("--chat-template") + 1] == str(chat_template_path("chatml-tools"))
    assert command[command.index("--tool-call-parser") + 1] == "llama3_json"
    assert "--enable-auto-tool-choice" in command
    assert command[command.index("--reasoning-parser") + 1] == "qwen3"
    bare = VLLMEngine("/models/x", python=sys.executable, tool_call_parser=None).command(8000)
    assert "--chat-template" not in bare and "--enable-auto-tool-choice" not in bare


def test_config_resolves_a_template_file_beside_it_and_refuses_a_missing_one(tmp_path: Path) -> None:
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "mine.jinja").write_text(MARKED)
    config_path = tmp_path / "run.yaml"
    config_path.write_text("chat_template: templates/mine.jinja\nvllm:\n  reasoning_parser: qwen3\n")
    config = load_config(config_path)
    assert config.chat_template == str((tmp_path / "templates" / "mine.jinja").resolve())
    assert config.vllm.reasoning_parser == "qwen3" and config.vllm.tool_call_parser == "auto"
    assert load_config(config_path, ["chat_template=chatml-tools"]).chat_template == "chatml-tools"
    with pytest.raises(ConfigError, match="chat_template.*neither a shipped template"):
        load_config(config_path, ["chat_template=templates/other.jinja"])


@pytest.mark.parametrize("name", ["chatml-tools", "chatml-tools-vision"])
def test_a_developer_message_renders_as_a_system_message(name: str) -> None:
    """OpenAI's `developer` role (the Agents SDK sends it) is the application's instructions: a system turn,
    with or without tools, first or later in the conversation."""
    template = Template(chat_template_path(name).read_text())
    tools = [{"type": "function", "function": {"name": "move", "parameters": {"type": "object"}}}]
    for tool_list in ([], tools):
        for before in ([], [{"role": "user", "content": "hi"}]):

            def render(role: str, tool_list: list = tool_list, before: list = before) -> str:
                messages = [
                    *before,
                    {"role": role, "content": "Be brief."},
                    {"role": "user", "content": "go"},
                ]
                return template.render(messages=messages, tools=tool_list, add_generation_prompt=True)

            assert render("developer") == render("system")
            assert "developer" not in render("developer")
