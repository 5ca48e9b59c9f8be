"""The stall watchdog names what a stuck run waits for: a hung agent is diagnosed as the agent."""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from bedrock_agentcore.runtime import BedrockAgentCoreApp

from agents.letters.main import rollout as letters_rollout
from agents.letters.run_files import serving, write_run_files
from handlers import RolloutContext, rft_app
from trainer.cli import main as cli_main
from trainer.ops.status import STALL_FILE
from trainer.ops.status import main as status_main
from trainer.run import LOG_FILE

released = threading.Event()


async def hang(row: dict[str, Any], ctx: RolloutContext) -> float:
    """An agent stuck before its first model call (a deadlock, a tool that never answers)."""
    while not released.is_set():
        await asyncio.sleep(0.05)
    return 0.0


# What the diagnosis says for the hung agent, numbers aside (docs/operations.md shows one verbatim).
DIAGNOSIS = (
    r"stall: no rollout finished and no token sampled for (\d+) s\n"
    r"  (http://127\.0\.0\.1:\d+): 8 rollouts, the latest model call \d+ s ago\n"
    r"  engine: 0 running, 0 waiting; no token sampled for \d+ s\n"
    r"  learner: step 0 done, waiting for step 1's rollouts\n"
    r"  likeliest: 8 rollouts at (http://127\.0\.0\.1:\d+) made no model call for \d+ s: "
    r"the agent is stuck, not the model"
)


def _status_while_stalled(run_dir: Path, shown: list[str]) -> None:
    """`rft status RUN` once the stall is on (its output captured apart from the test's own)."""
    deadline = time.monotonic() + 120
    while not (run_dir / STALL_FILE).is_file() and time.monotonic() < deadline:
        time.sleep(0.02)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status_main([str(run_dir)])
    shown.append(out.getvalue())


def test_a_hung_agent_is_diagnosed_then_the_run_stops_with_the_diagnosis(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    released.clear()
    with serving(rft_app(hang)) as agent_url:
        try:
            config_path = write_run_files(
                tmp_path,
                tiny_model_dir,
                agent_url,
                eval_file=None,
                max_steps=1,
                faults={"stall_warn_s": 1, "stall_timeout_s": 3, "on_stall_timeout": "stop_run"},
            )
            shown: list[str] = []
            watching = threading.Thread(target=_status_while_stalled, args=(tmp_path / "run", shown))
            watching.start()
            code = cli_main([str(config_path)])
            watching.join()
        finally:
            released.set()
    assert code == 1
    err = capsys.readouterr().err
    stopped = re.search(rf"rft train: {DIAGNOSIS}\nstopped by faults\.stall_timeout_s \(3 s\)", err)
    assert stopped is not None, err[-3000:]
    assert int(stopped.group(1)) >= 3 and stopped.group(2) == stopped.group(3) == agent_url
    # `rft status` showed the live stall; it shows none once the run is over.
    assert re.search(rf"stalled now:\n{DIAGNOSIS}", shown[0]) is not None, shown
    assert not (tmp_path / "run" / STALL_FILE).exists()
    # The warning came first, at stall_warn_s, in train.log as on the console.
    warned = re.search(DIAGNOSIS, (tmp_path / "run" / LOG_FILE).read_text())
    assert warned is not None and 1 <= int(warned.group(1)) < 3
    # metrics.jsonl keeps the stall and the stop, in a line of its own (no step finished).
    (line,) = [json.loads(text) for text in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    (stall,) = line["stalls"]
    assert line["step"] == 1 and "stopped by faults.stall_timeout_s (3 s)" in line["stopped"]
    assert (stall["action"], stall["rollouts"], stall["failed"]) == ("stopped_run", 8, 0)
    assert stall["stalled_s"] >= 3 and re.fullmatch(DIAGNOSIS, stall["diagnosis"]) is not None


def _every_other_hangs() -> BedrockAgentCoreApp:
    """Half the rollouts play the letters agent; the other half hang before their first model call."""
    arrivals = itertools.count()

    async def rollout(row: dict[str, Any], ctx: RolloutContext) -> Any:
        if next(arrivals) % 2:
            return await hang(row, ctx)
        return await letters_rollout(row, ctx)

    return rft_app(rollout)


def _scrape_while_stalled(run_dir: Path, scraped: list[str]) -> None:
    """The trainer's Prometheus page once the stall is diagnosed."""
    deadline = time.monotonic() + 120
    while not (run_dir / STALL_FILE).is_file() and time.monotonic() < deadline:
        time.sleep(0.02)
    url = re.search(r"Prometheus metrics at (\S+)", (run_dir / LOG_FILE).read_text())
    assert url is not None
    scraped.append(httpx.get(url.group(1), timeout=10).text)


def test_hung_rollouts_fail_as_stalled_and_the_step_completes_with_the_rest(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    released.clear()
    with serving(_every_other_hangs()) as agent_url:
        try:
            config_path = write_run_files(
                tmp_path,
                tiny_model_dir,
                agent_url,
                eval_file=None,
                max_steps=1,
                faults={"stall_warn_s": 1, "stall_timeout_s": 3},
                policy_server={"metrics_port": 0},
            )
            scraped: list[str] = []
            watching = threading.Thread(target=_scrape_while_stalled, args=(tmp_path / "run", scraped))
            watching.start()
            code = cli_main([str(config_path)])
            watching.join()
        finally:
            released.set()
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    log = (tmp_path / "run" / LOG_FILE).read_text()  # what the console showed, as it logs it
    assert "faults.stall_timeout_s (3 s): 4 rollouts failed as stalled; the step goes on with the rest" in log
    assert "step 1: 4 of 8 rollouts failed: stalled x4, first: stalled: no rollout finished" in log
    (record,) = [json.loads(text) for text in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert record["rollouts"] == {**record["rollouts"], "ok": 4, "failed": 4}
    assert record["failures"]["stalled"] == 4
    assert f"its agent at {agent_url} made no model call" in record["failure_errors"]["stalled"]
    (stall,) = record["stalls"]
    assert (stall["action"], stall["rollouts"], stall["failed"]) == ("failed_rollouts", 4, 4)
    assert "4 rollouts at" in stall["diagnosis"] and stall["stalled_s"] >= 3
    # Prometheus showed the stall while it lasted.
    page = scraped[0]
    assert 'rftkit_train_stalls_total{action="warned"} 1.0' in page
    assert "rftkit_train_stalled_rollouts 4.0" in page
    stalled_s = re.search(r"^rftkit_train_stall_seconds (\S+)$", page, re.MULTILINE)
    assert stalled_s is not None and float(stalled_s.group(1)) >= 1
