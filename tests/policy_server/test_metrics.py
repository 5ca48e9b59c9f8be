"""Prometheus metrics on their own port: real calls through the gateway (hf engine, tiny model), then a
scrape of /metrics parsed with prometheus_client's own parser."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from handlers.protocol import COMPLETE_ROLLOUT_PATH, JOB_ARN_HEADER, TRAJECTORY_ID_HEADER
from policy_server import PolicyServer, ServerThread
from policy_server.engines.hf import HFEngine
from policy_server.http.metrics import start_metrics_server

JOB = "arn:aws:sagemaker:us-west-2:123456789012:training-job/metrics"
CHAT = "/v1/chat/completions"


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition: (name, sorted labels) -> value."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(url: str) -> Samples:
    response = httpx.get(f"{url}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[tuple[PolicyServer, ServerThread, str]]:
    server = PolicyServer(HFEngine(tiny_model_dir, max_batch_size=8))
    thread = ServerThread(server).start()
    metrics = start_metrics_server(server.metrics, "127.0.0.1", 0)
    server.open_job(JOB, max_tokens=6, max_calls_per_rollout=10)
    try:
        yield server, thread, metrics.url
    finally:
        metrics.stop()
        thread.stop()


def chat(url: str, rollout_id: str | None) -> httpx.Response:
    headers = {JOB_ARN_HEADER: JOB}
    if rollout_id is not None:
        headers[TRAJECTORY_ID_HEADER] = rollout_id
    body = {"model": "policy", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 6, "seed": 1}
    return httpx.post(f"{url}{CHAT}", json=body, headers=headers, timeout=60)


def test_calls_tokens_rollouts_and_engine_show_on_the_metrics_port(
    served: tuple[PolicyServer, ServerThread, str], tmp_path: Path, random_adapter: Callable[..., Path]
) -> None:
    server, thread, metrics_url = served
    url = thread.url
    before = scrape(metrics_url)
    assert value(before, "rftkit_adapter_version") == 0
    assert value(before, "rftkit_rollouts_in_flight") == 0

    server.open_rollout(JOB, "r1")
    server.open_rollout(JOB, "r2")
    answers = [chat(url, "r1"), chat(url, "r1"), chat(url, "r2")]
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    assert chat(url, None).status_code == 400  # no rollout header: a refusal, counted by its status
    report = {"JobArn": JOB, "TrajectoryId": "r1", "Status": "ready"}
    assert httpx.post(f"{url}{COMPLETE_ROLLOUT_PATH}", json=report, timeout=10).status_code == 200
    assert httpx.get(f"{url}/no-such-route", timeout=10).status_code == 404
    in_flight = scrape(metrics_url)
    assert value(in_flight, "rftkit_rollouts_in_flight") == 2
    traces = [server.take_trace(JOB, "r1"), server.take_trace(JOB, "r2")]
    server.open_rollout(JOB, "r3")
    server.take_trace(JOB, "r3")
    version = thread.run(server.load_adapter(random_adapter(tmp_path / "v1", seed=1)))

    after = scrape(metrics_url)
    assert value(after, "rftkit_http_requests_total", route=CHAT, status="200") == 3
    assert value(after, "rftkit_http_requests_total", route=CHAT, status="400") == 1
    assert value(after, "rftkit_http_requests_total", route=COMPLETE_ROLLOUT_PATH, status="200") == 1
    assert value(after, "rftkit_http_requests_total", route="other", status="404") == 1
    assert value(after, "rftkit_http_request_duration_seconds_count", route=CHAT, status="200") == 3
    # A generation takes longer than a refusal; every call lies under the last finite bucket.
    assert value(after, "rftkit_http_request_duration_seconds_sum", route=CHAT, status="200") > 0
    assert (
        value(after, "rftkit_http_request_duration_seconds_bucket", route=CHAT, status="200", le="+Inf") == 3
    )
    calls = [call for trace in traces for call in trace.calls]
    assert value(after, "rftkit_prompt_tokens_total") == sum(len(c.prompt_token_ids) for c in calls)
    assert value(after, "rftkit_sampled_tokens_total") == sum(len(c.completion_token_ids) for c in calls)
    assert value(after, "rftkit_calls_in_flight") == 0
    assert value(after, "rftkit_rollouts_in_flight") == 0
    assert value(after, "rftkit_rollouts_reported_total", status="ready") == 1
    assert value(after, "rftkit_adapter_version") == version == 1
    # The hf engine's batch: idle now, its limit, and one row or more per forward pass.
    assert value(after, "rftkit_engine_running") == 0 and value(after, "rftkit_engine_waiting") == 0
    assert value(after, "rftkit_engine_batch_capacity") == 8
    passes = value(after, "rftkit_engine_forward_passes_total")
    assert passes >= 3 and value(after, "rftkit_engine_batch_rows_total") >= passes


def test_metrics_are_not_served_to_agents(served: tuple[PolicyServer, ServerThread, str]) -> None:
    _, thread, metrics_url = served
    url = thread.url
    assert httpx.get(f"{url}/metrics", timeout=10).status_code == 404
    assert httpx.get(f"{metrics_url}/v1/models", timeout=10).status_code == 404


def test_two_servers_in_one_process_keep_their_own_series(tiny_model_dir: Path) -> None:
    first, second = PolicyServer(HFEngine(tiny_model_dir)), PolicyServer(HFEngine(tiny_model_dir))
    first.metrics.record_call(5, 2)
    assert value(parse(first.metrics.exposition().decode()), "rftkit_prompt_tokens_total") == 5
    assert value(parse(second.metrics.exposition().decode()), "rftkit_prompt_tokens_total") == 0


def test_rft_serve_metrics_port(tiny_model_dir: Path) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "handlers.cli",
            "serve",
            "--model",
            str(tiny_model_dir),
            "--port",
            "0",
            "--metrics-port",
            "0",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 600  # a loaded 2-core machine takes minutes to import and load
        metrics_url = None
        while metrics_url is None and time.monotonic() < deadline:
            line = process.stdout.readline()
            if line.startswith("Prometheus metrics: "):
                metrics_url = line.split(": ", 1)[1].strip().removesuffix("/metrics")
        assert metrics_url is not None
        assert value(scrape(metrics_url), "rftkit_adapter_version") == 0
    finally:
        process.terminate()
        process.wait(30)
