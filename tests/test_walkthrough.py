"""docs/walkthrough.md, run as written: every block marked ``<!-- walkthrough -->`` is run line by line,
in order, and every block marked ``<!-- walkthrough: NAME -->`` is written to the file NAME, in a fresh
directory holding the checkout's ``agents/`` (real tiny model built by the page's own command, real
agents on uvicorn, real `rft` commands, a real `rft serve --inference` process and a real curl).

What the page cannot say literally is translated, nothing else: an agent started with
``python agents/NAME/main.py &`` is that module's app served on a free port (the page's
``http://localhost:PORT`` becomes its URL), and the inference server binds a free port (the page's
``127.0.0.1:8000`` becomes it)."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from importlib import import_module
from pathlib import Path

import pytest

from handlers import serve_in_thread
from handlers.cli import main as rft

REPO_ROOT = Path(__file__).resolve().parents[1]
WALKTHROUGH = REPO_ROOT / "docs" / "walkthrough.md"
BLOCK = re.compile(r"<!-- walkthrough(?:: (?P<file>[\w.]+))? -->\n```\w*\n(?P<body>.*?)```", re.DOTALL)
AGENT = re.compile(r"python agents/(?P<name>\w+)/main\.py &")
# The port each agent's own `app.run(...)` binds, as the page's URLs name it.
AGENT_PORTS = {"template": 8080, "letters": 8081}
DOC_SERVER = "127.0.0.1:8000"

# What each `rft` command of the page must print, beyond exiting 0: the step did what the page says.
EXPECTED = {
    "rft smoke http://localhost:8080 --payload agents/template/payloads/smoke.json": ["HEALTHY"],
    "--model models/tiny": ["=== episode 1 · the payload's row", "[system]", "What is 12 * (3 + 4)?"],
    "rft train": [
        "rft train: 2 steps done in ",
        "/runs/letters; final adapter v2 at ",
        "/runs/letters/adapters/v2",
    ],
    "rft show runs/letters --best": ["=== step 2", "[user]", "[assistant]"],
    "rft show runs/letters --eval 0": ["=== eval 0"],
    "rft eval": ["| policy | success | mean reward |", "runs/letters/adapters/v2"],
    "rft export": ["checked against the trained policy", "the same tokens"],
    "rft sft": ["sft step 4/4  loss ", " steps/s  eta 0s", "adapter written to runs/sft-"],
}


def blocks() -> list[tuple[str | None, str]]:
    """The page's marked blocks in order: (file name or None for commands, text)."""
    return [(found["file"], found["body"]) for found in BLOCK.finditer(WALKTHROUGH.read_text())]


def _localized(text: str, agent_urls: dict[int, str]) -> str:
    for port, url in agent_urls.items():
        text = text.replace(f"http://localhost:{port}", url)
    return text


class Day:
    """The state of the walk: the agents and servers it started, stopped at its end."""

    def __init__(self, stack: ExitStack) -> None:
        self.stack = stack
        self.agent_urls: dict[int, str] = {}
        self.server: str | None = None

    def start_agent(self, name: str) -> None:
        app = import_module(f"agents.{name}.main").app
        self.agent_urls[AGENT_PORTS[name]] = self.stack.enter_context(serve_in_thread(app))

    def start_inference_server(self, line: str) -> None:
        argv = shlex.split(line.removesuffix("&").replace("--port 8000", "--port 0"))
        command = [sys.executable, "-u", "-m", "handlers.cli", *argv[1:], "--log-level", "warning"]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.stack.callback(_stop, process)
        assert process.stdout is not None
        printed = []
        for output in process.stdout:
            printed.append(output)
            if output.startswith("Ctrl-C"):
                break
        found = re.search(r"endpoint: http://(127\.0\.0\.1:\d+)/v1", "".join(printed))
        assert found is not None, "".join(printed)
        self.server = found.group(1)

    def curl(self, line: str) -> None:
        assert self.server is not None, "the page calls the inference server before starting it"
        done = subprocess.run(
            shlex.split(line.replace(DOC_SERVER, self.server)), capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert answer["choices"][0]["message"]["role"] == "assistant", answer
        assert 1 <= answer["usage"]["completion_tokens"] <= 8

    def rft(self, line: str, capsys: pytest.CaptureFixture[str]) -> None:
        code = rft(shlex.split(_localized(line, self.agent_urls))[1:])
        printed = capsys.readouterr().out
        assert code == 0, f"{line}\n{printed}"
        for key, expected in EXPECTED.items():
            if key in line:
                missing = [text for text in expected if text not in printed]
                assert not missing, f"{line}: {missing} not printed:\n{printed}"


def _stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture
def day(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Day]:
    (tmp_path / "agents").symlink_to(REPO_ROOT / "agents")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as `rft` sets it, undone after the test
    with ExitStack() as stack:
        yield Day(stack)


def test_the_page_marks_every_step_of_the_day() -> None:
    commands = " ".join(body for name, body in blocks() if name is None)
    for command in ("rft model tiny", "rft smoke", "--model", "rft sft", "rft train", "rft show", "rft eval"):
        assert command in commands
    assert "rft export" in commands and "rft serve --inference" in commands and "curl" in commands
    assert {name for name, _ in blocks()} == {None, "train.jsonl", "eval.jsonl", "run.yaml", "demos.jsonl"}
    assert "(docs/walkthrough.md)" in (REPO_ROOT / "README.md").read_text()


@pytest.mark.slow
def test_every_command_of_the_walkthrough_runs_in_order(
    day: Day, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ran = []
    for name, body in blocks():
        if name is not None:
            (tmp_path / name).write_text(_localized(body, day.agent_urls))
            continue
        for line in filter(None, map(str.strip, body.splitlines())):
            if (agent := AGENT.fullmatch(line)) is not None:
                day.start_agent(agent["name"])
            elif line.startswith("rft serve --inference"):
                day.start_inference_server(line)
            elif line.startswith("curl "):
                day.curl(line)
            else:
                assert line.startswith("rft "), f"the page runs {line!r}, which this test cannot"
                day.rft(line, capsys)
            ran.append(line)
    assert len(ran) == 16, ran
    assert (tmp_path / "exports" / "letters" / "adapter_config.json").is_file()
    for family in ("qwen3", "gpt-oss"):  # the multi-turn warm starts (issue 50.1)
        assert (tmp_path / "runs" / f"sft-{family}" / "adapter_config.json").is_file()
    assert (tmp_path / "runs" / "letters-eval" / "eval.png").is_file()
