"""Adapter versions hot-loaded while rollouts run: every call records the version that sampled it, outputs
change after the swap, and retired versions are unloaded once no call uses them."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER
from policy_server import PolicyServer, ServerThread
from policy_server.engines.hf import HFEngine

JOB = "arn:aws:sagemaker:us-west-2:123456789012:training-job/adapters"


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[tuple[PolicyServer, ServerThread]]:
    server = PolicyServer(HFEngine(tiny_model_dir))
    thread = ServerThread(server).start()
    server.open_job(JOB, max_tokens=8, max_calls_per_rollout=100)
    try:
        yield server, thread
    finally:
        thread.stop()


def _greedy(client: openai.OpenAI) -> list[int]:
    response = client.chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=8,
        temperature=0.0,
    )
    return response.choices[0].model_extra["token_ids"]


def _client(url: str, rollout_id: str) -> openai.OpenAI:
    headers = {JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: rollout_id}
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", default_headers=headers)


def test_adapter_loaded_while_rollouts_run(
    served: tuple[PolicyServer, ServerThread],
    tiny_model_dir: Path,
    tmp_path: Path,
    random_adapter: Callable[..., Path],
) -> None:
    server, thread = served
    adapter = random_adapter(tmp_path / "v1", seed=1, std=0.5)
    server.open_rollout(JOB, "probe")
    probe = _client(thread.url, "probe")
    before = _greedy(probe)

    rollout_ids = [f"r{i}" for i in range(8)]
    for rollout_id in rollout_ids:
        server.open_rollout(JOB, rollout_id)
    keep_playing = threading.Event()
    keep_playing.set()
    calls_made = dict.fromkeys(rollout_ids, 0)

    async def play(rollout_id: str) -> None:
        headers = {JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: rollout_id}
        client = openai.AsyncOpenAI(base_url=f"{thread.url}/v1", api_key="k", default_headers=headers)
        async with client:
            while keep_playing.is_set():
                content = f"{rollout_id} {calls_made[rollout_id]}"
                await client.chat.completions.create(
                    model="default", messages=[{"role": "user", "content": content}], max_tokens=4
                )
                calls_made[rollout_id] += 1

    async def play_all() -> None:
        await asyncio.gather(*(play(rollout_id) for rollout_id in rollout_ids))

    def wait_for_calls(at_least: dict[str, int]) -> None:
        deadline = time.monotonic() + 60
        while any(calls_made[r] < n for r, n in at_least.items()) and time.monotonic() < deadline:
            time.sleep(0.01)

    players = threading.Thread(target=lambda: asyncio.run(play_all()))
    players.start()
    try:
        wait_for_calls(dict.fromkeys(rollout_ids, 1))
        version = thread.run(server.load_adapter(adapter))
        loaded_at = time.time()
        wait_for_calls({r: n + 2 for r, n in calls_made.items()})
    finally:
        keep_playing.clear()
        players.join()

    assert version == 1 and server.current_adapter_version == 1
    seen_versions = set()
    for rollout_id in rollout_ids:
        calls = server.take_trace(JOB, rollout_id).calls
        versions = [call.adapter_version for call in calls]
        assert versions == sorted(versions), versions  # a rollout never goes back to an older version
        for call in calls:
            if call.started_at > loaded_at:
                assert call.adapter_version == 1
            seen_versions.add(call.adapter_version)
    assert seen_versions == {0, 1}

    after = _greedy(probe)
    assert after != before
    probe_calls = server.take_trace(JOB, "probe").calls
    assert [call.adapter_version for call in probe_calls] == [0, 1]
    assert probe_calls[0].prompt_token_ids == probe_calls[1].prompt_token_ids
    probe.close()


def test_versions_are_numbered_freshly_and_retired_ones_unloaded(
    served: tuple[PolicyServer, ServerThread],
    tiny_model_dir: Path,
    tmp_path: Path,
    random_adapter: Callable[..., Path],
) -> None:
    server, thread = served
    first = random_adapter(tmp_path / "a", seed=2, std=0.5)
    second = random_adapter(tmp_path / "b", seed=3, std=0.5)
    start = server.current_adapter_version
    assert thread.run(server.load_adapter(first)) == start + 1
    assert thread.run(server.load_adapter(second)) == start + 2
    with httpx.Client(base_url=thread.url, timeout=60) as client:
        assert client.get("/health").json()["adapter_version"] == start + 2
    # No call was in flight, so every version but the current one is gone from the engine.
    assert server.loaded_adapter_versions == (start + 2,)
    with pytest.raises(ValueError, match="not a peft adapter directory"):
        thread.run(server.load_adapter(tmp_path / "missing"))
    assert server.current_adapter_version == start + 2


def test_a_pinned_rollout_samples_on_its_version_until_its_trace_is_taken(
    served: tuple[PolicyServer, ServerThread],
    tiny_model_dir: Path,
    tmp_path: Path,
    random_adapter: Callable[..., Path],
) -> None:
    """Asynchronous training: a rollout opened on version v keeps sampling on v (and v stays loaded)
    while newer versions are loaded; once its trace is taken, v is unloaded at the next load."""
    server, thread = served
    pinned = thread.run(server.load_adapter(random_adapter(tmp_path / "p", seed=4, std=0.5)))
    server.open_rollout(JOB, "pinned", adapter_version=pinned)
    server.open_rollout(JOB, "unpinned")
    newer = thread.run(server.load_adapter(random_adapter(tmp_path / "n", seed=5, std=0.5)))
    assert server.loaded_adapter_versions == (pinned, newer)
    assert server.pinned_adapter_versions == (pinned,)
    with _client(thread.url, "pinned") as on_pinned, _client(thread.url, "unpinned") as on_newer:
        assert _greedy(on_pinned) != _greedy(on_newer)
    assert [call.adapter_version for call in server.take_trace(JOB, "pinned").calls] == [pinned]
    assert [call.adapter_version for call in server.take_trace(JOB, "unpinned").calls] == [newer]
    assert server.pinned_adapter_versions == ()
    latest = thread.run(server.load_adapter(random_adapter(tmp_path / "l", seed=6, std=0.5)))
    assert server.loaded_adapter_versions == (latest,)
    with pytest.raises(ValueError, match="not loaded"):
        server.open_rollout(JOB, "stale", adapter_version=pinned)
