"""The README's agent snippet, run as written through `rft smoke`: it is the template's own code (the
refusal of the smoke endpoint caught and scored), and smoke without --payload says to pass a row."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import agents.template.main as template
from handlers.smoke_cli import main as smoke

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATE_PAYLOAD = REPO_ROOT / "agents" / "template" / "payloads" / "smoke.json"


def readme_snippet() -> str:
    """The Python block under "Write an agent" in the README."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme[readme.index("## Write an agent") :]
    found = re.search(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert found is not None, "the README's 'Write an agent' section has no Python block"
    return found.group(1)


def readme_app() -> Any:
    """The snippet's ``app``, its code run as written over the template's tool, prompt and reward."""
    namespace = {name: getattr(template, name) for name in ("SYSTEM_PROMPT", "calculate", "reward")}
    namespace |= {"NO_PLAY_REWARD": template.NO_PLAY_REWARD, "TRUNCATED_REWARD": template.TRUNCATED_REWARD}
    namespace["__name__"] = "readme_agent"
    exec(compile(readme_snippet(), "README.md", "exec"), namespace)
    return namespace["app"]


def test_the_readme_snippet_is_the_templates_code() -> None:
    snippet = readme_snippet()
    source = (REPO_ROOT / "agents" / "template" / "main.py").read_text()
    body = snippet[snippet.index("async def rollout(") :]
    assert body in source, "the README's rollout and app differ from agents/template/main.py"
    assert "except Exception as error:" in body and "refused_by_endpoint(error)" in body


def test_the_readme_snippet_passes_rft_smoke_as_written(
    serve: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url = serve(readme_app())
    code = smoke([url, "--payload", str(TEMPLATE_PAYLOAD), "--timeout", "30"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert f"HEALTHY: the agent came back with its no-play reward {template.NO_PLAY_REWARD:g}" in printed


def test_smoke_without_a_payload_says_to_pass_a_row_when_the_agent_cannot_read_its_own(
    serve: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./payloads/smoke.json: the built-in row {} is sent
    url = serve(readme_app())
    assert smoke([url, "--timeout", "30"]) == 3
    printed = capsys.readouterr().out
    assert "agent answered HTTP 500: KeyError: 'question'" in printed
    assert (
        "rft smoke sent the built-in smoke payload, whose row your agent cannot read: pass a payload "
        "holding one of your rows in its prompt with --payload FILE" in printed
    )
    # With the agent's own row, the same agent is healthy: the hint is about the payload only.
    assert smoke([url, "--payload", str(TEMPLATE_PAYLOAD), "--timeout", "30"]) == 0
