"""The gateway workers' link to the job state, and the pool's refusals, without vLLM.

The pool with real vLLM (same traces as one gateway, keys, a dying worker) is tested in
``test_vllm_engine.py``, on that module's vLLM server.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from policy_server.engines.vllm import VLLMEngine
from policy_server.jobs import JobLimits, JobRegistry, Rejection
from policy_server.server import PolicyServer
from policy_server.trace import CallRecord
from policy_server.workers.gateway_pool import GatewayPool
from policy_server.workers.remote_state import RemoteRegistry
from policy_server.workers.state_link import StateClient, StateLinkError, serve_link


@pytest.fixture
def registry_link(tmp_path: Path) -> Iterator[tuple[JobRegistry, StateClient]]:
    """A registry served over a real Unix-socket link from a loop in another thread."""
    registry = JobRegistry()

    def refuse(text: str) -> None:
        raise ValueError(text)

    def crash() -> None:
        raise KeyError("boom")

    handlers = {
        "open_job": registry.open_job,
        "open_rollout": registry.open_rollout,
        "check_rollout": registry.check_rollout,
        "limits": registry.limits,
        "start_call": registry.start_call,
        "record_call": registry.record_call,
        "take_trace": registry.take_trace,
        "refuse": refuse,
        "crash": crash,
    }
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    path = str(tmp_path / "state.sock")
    served = threading.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await serve_link(reader, writer, handlers)
        finally:
            served.set()

    async def open_link() -> asyncio.AbstractServer:
        return await asyncio.start_unix_server(serve, path)

    server = asyncio.run_coroutine_threadsafe(open_link(), loop).result()
    client = StateClient(path)
    try:
        yield registry, client
    finally:
        client.close()
        assert served.wait(5), "the link did not end when its client closed"
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_the_link_carries_answers_and_each_kind_of_refusal(
    registry_link: tuple[JobRegistry, StateClient],
) -> None:
    registry, client = registry_link
    remote = RemoteRegistry(client)
    remote.open_job("job", JobLimits(max_calls_per_rollout=2))
    remote.open_rollout("job", "r")
    remote.check_rollout("job", "r")
    first, second = remote.start_call("job", "r"), remote.start_call("job", "r")
    assert (first.call_number, second.call_number) == (0, 1)
    with pytest.raises(Rejection) as over_cap:  # the registry's own refusal, status and sentence
        remote.start_call("job", "r")
    assert over_cap.value.status_code == 400 and "max_calls_per_rollout" in over_cap.value.message
    record = CallRecord(
        index=second.sequence,
        prompt_token_ids=[1, 2],
        completion_token_ids=[3],
        completion_logprobs=[-0.5],
        adapter_version=0,
        finish_reason="stop",
        started_at=0.0,
        finished_at=1.0,
    )
    remote.record_call(second, record)
    trace = registry.take_trace("job", "r")  # the record reached the state process's registry
    assert [call.completion_token_ids for call in trace.calls] == [[3]]
    with pytest.raises(ValueError, match="not an adapter"):
        client.call("refuse", "not an adapter")
    with pytest.raises(StateLinkError, match="KeyError"):
        client.call("crash")
    with pytest.raises(StateLinkError, match="no method 'drop_everything'"):
        client.call("drop_everything")
    assert remote.limits("job").max_calls_per_rollout == 2  # the link still serves after failures


def test_the_pool_needs_the_vllm_engine_and_stops_safely_unstarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class InProcessEngine:
        model_name = "policy"

    with pytest.raises(ValueError, match="need the vllm engine"):
        GatewayPool(PolicyServer(InProcessEngine()), workers=2, log_level="warning")  # type: ignore[arg-type]
    monkeypatch.chdir(tmp_path)
    kept = tmp_path / "kept.txt"
    kept.write_text("the working directory is not the pool's to remove")
    engine = VLLMEngine(tmp_path, base_url="http://127.0.0.1:9")
    GatewayPool(PolicyServer(engine), workers=2, log_level="warning").stop()
    assert kept.is_file()
