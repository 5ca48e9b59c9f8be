"""``rft serve --inference``: a real process serving the tiny model and an adapter to a plain OpenAI
client (no job headers), keeping nothing of the calls."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from policy_server.cli import main


def _samples(metrics_url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{metrics_url}/metrics", timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_inference_server_answers_plain_calls_and_keeps_nothing(
    tiny_model_dir: Path, tmp_path: Path, random_adapter: Callable[..., Path]
) -> None:
    adapter = random_adapter(tmp_path / "adapter", seed=5)
    command = [sys.executable, "-u", "-m", "handlers.cli", "serve", "--model", str(tiny_model_dir)]
    command += ["--adapter", str(adapter), "--inference", "--max-tokens", "8", "--port", "0"]
    command += ["--metrics-port", "0", "--log-level", "warning"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None
        printed = []
        for line in process.stdout:
            printed.append(line)
            if line.startswith("Ctrl-C"):
                break
        output = "".join(printed)
        endpoint = re.search(r"endpoint: (http://127\.0\.0\.1:\d+/v1)", output)
        metrics = re.search(r"metrics: (http://127\.0\.0\.1:\d+)/metrics", output)
        assert endpoint is not None and metrics is not None, output
        assert "no job headers" in output and "loaded as version 1" in output

        with openai.OpenAI(base_url=endpoint.group(1), api_key="unused", max_retries=0) as client:
            replies = [
                client.chat.completions.create(
                    model="default", messages=[{"role": "user", "content": "hi"}], temperature=0
                )
                for _ in range(2)
            ]
        assert all(1 <= reply.usage.completion_tokens <= 8 for reply in replies)
        # Greedy on the same adapter: the same tokens both times.
        assert (
            replies[0].choices[0].model_extra["token_ids"] == replies[1].choices[0].model_extra["token_ids"]
        )

        samples = _samples(metrics.group(1))
        ok = (("route", "/v1/chat/completions"), ("status", "200"))
        assert samples[("rftkit_http_requests_total", ok)] == 2
        assert samples[("rftkit_rollouts_in_flight", ())] == 0  # no rollout opened, no trace held
        assert samples[("rftkit_adapter_version", ())] == 1
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0


def test_inference_refuses_an_open_job(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", str(tiny_model_dir), "--inference", "--open-job", "arn:local:job/dev"]) == 2
    assert "--inference serves calls without jobs" in capsys.readouterr().out
