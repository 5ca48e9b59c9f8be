"""vLLM's own tool-call and reasoning parsers (``policy_server/vllm_family_parse.py``), in one process of
vLLM's environment kept for a pytest worker's session: importing vLLM's parsers costs seconds, a parse
milliseconds, and five test modules compare a family's parse with vLLM's."""

from __future__ import annotations

import json
import os
import select
import subprocess
import tempfile
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).parent / "policy_server" / "vllm_family_parse.py"
ANSWER = "ANSWER "
# Read by openai-harmony where the job is parsed: a test module names its vocabulary's folder here.
PASSED_ENVIRON = ("TIKTOKEN_ENCODINGS_BASE",)


class VLLMParsers:
    """Call with a job of ``vllm_family_parse.py``; returns one parse per case, as vLLM's server's."""

    def __init__(self, python: str, timeout_s: float = 300.0) -> None:
        self.python = python
        self.timeout_s = timeout_s
        self._process: subprocess.Popen[str] | None = None
        self._log = tempfile.NamedTemporaryFile("w+", prefix="vllm-parsers-", suffix=".log")

    def __call__(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        process = self._started()
        environ = {name: os.environ[name] for name in PASSED_ENVIRON if name in os.environ}
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps({**job, "environ": environ}) + "\n")
        process.stdin.flush()
        while True:
            ready, _, _ = select.select([process.stdout], [], [], self.timeout_s)
            line = process.stdout.readline() if ready else ""
            if not line:
                raise AssertionError(f"vLLM's parsers gave no answer ({self._tail()})")
            if line.startswith(ANSWER):
                answer = json.loads(line.removeprefix(ANSWER))
                assert "error" not in answer, answer.get("error")
                parsed: list[dict[str, Any]] = answer["parsed"]
                return parsed

    def _started(self) -> subprocess.Popen[str]:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                [self.python, str(SCRIPT)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
                text=True,
            )
        return self._process

    def _tail(self) -> str:
        self._log.seek(0)
        return f"exit {self._process.poll() if self._process else None}; stderr: {self._log.read()[-3000:]}"

    def close(self) -> None:
        if self._process is not None:
            if self._process.stdin is not None:
                self._process.stdin.close()
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()
