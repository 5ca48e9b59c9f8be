"""A prompt is refused by its size before it is tokenised whole: one 14 MiB chat call moves the
server's memory by a few tens of MB at most, and the server keeps serving."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from handlers import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER

JOB = "job-prompt-size"
MB = 1024 * 1024


def _memory_kb(pid: int, field: str) -> int:
    """VmHWM (the peak resident set) or VmRSS of a process, in kB, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB$", status, re.MULTILINE)
    assert match is not None, status
    return int(match.group(1))


@pytest.fixture(scope="module")
def serve(tiny_model_dir: Path) -> Iterator[tuple[str, int]]:
    command = [sys.executable, "-m", "handlers.cli", "serve", "--model", str(tiny_model_dir), "--port", "0"]
    command += ["--open-job", JOB, "--max-tokens", "4", "--log-level", "warning"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if found := re.search(r"endpoint: (http://\S+)/v1", line):
                url = found.group(1)
                break
        else:
            pytest.fail(f"rft serve exited with {process.wait()} before it served")
        yield url, process.pid
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)


def _call(client: httpx.Client, rollout: str, content: str) -> httpx.Response:
    body = {"model": "default", "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    return client.post(
        "/v1/chat/completions", json=body, headers={JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: rollout}
    )


def test_a_14_mib_prompt_is_refused_without_taking_the_servers_memory(serve: tuple[str, int]) -> None:
    url, pid = serve
    with httpx.Client(base_url=url, timeout=120) as client:
        assert _call(client, "warm-up", "hello").status_code == 200
        peak_before, rss_before = _memory_kb(pid, "VmHWM"), _memory_kb(pid, "VmRSS")
        answer = _call(client, "huge", "word " * (14 * MB // 5))
        assert answer.status_code == 400
        assert (
            "characters of text, more than the model's 2048-token context"
            in answer.json()["error"]["message"]
        )
        grown_mb = (_memory_kb(pid, "VmHWM") - peak_before) / 1024
        assert grown_mb < 100, f"the refused prompt raised the server's peak memory by {grown_mb:.0f} MB"
        assert _call(client, "after", "hello").status_code == 200
    left_mb = (_memory_kb(pid, "VmRSS") - rss_before) / 1024
    assert left_mb < 100, f"the server holds {left_mb:.0f} MB more after the refusal"
