"""Hostile input against `rft serve`: what agents can send costs the server no 5xx, no open admin route,
no lasting memory, and changes no innocent rollout.

A real `rft serve` process (hf engine, the tiny model built offline, an open job, an API key and an
admin key) on loopback. Before and after the attack, innocent rollouts play seeded calls; their
answers must be the same token for token. The attack sends, per category, a bounded number of
requests (``--repeat`` each): malformed JSON and wrong types, numeric extremes, long strings and deep
nesting, NUL and unusual unicode, bad images, bad or missing headers and keys, admin routes with the
agents' key, path traversal, template injection, malformed tools, refused chat fields, feedback with
fresh rollout ids, oversized bodies and prompts, wrong methods, streaming. It reads the server's
resident memory (VmRSS) and peak (VmHWM) from /proc after a first round (the allocator's pools) and
after the attack.

    .venv/bin/python bench/hostile.py [--repeat 20] [--out bench/results/hostile.json]

Writes the counts per category and status, the memory figures and the verdict; exits 1 on a 5xx, an
admin route opened by the agents' key, a changed innocent rollout, or more than 100 MB kept.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Generator
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from handlers import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER  # noqa: E402
from policy_server.models import build_tiny_model  # noqa: E402

JOB = "arn:aws:sagemaker:bench:job/hostile"
API_KEY, ADMIN_KEY = "agents-key", "admin-key"
MB = 1024 * 1024
KEPT_LIMIT_MB = 100.0

Request = tuple[str, str, dict[str, str], bytes]  # method, path, headers, body


def _headers(rollout: str, key: str = API_KEY) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {key}",
        JOB_ARN_HEADER: JOB,
        TRAJECTORY_ID_HEADER: rollout,
        "Content-Type": "application/json",
    }


def _chat(rollout: str, **fields: Any) -> Request:
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}
    return "POST", "/v1/chat/completions", _headers(rollout), json.dumps(body).encode()


def _raw(rollout: str, body: bytes) -> Request:
    return "POST", "/v1/chat/completions", _headers(rollout), body


def categories(index: int) -> dict[str, list[Request]]:
    """One round of every category; ``index`` makes the rollout ids fresh."""
    r = f"attack-{index}"
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    return {
        "bad JSON": [_raw(r, b"{"), _raw(r, b"\xff\xfe"), _raw(r, b"[]"), _raw(r, b"null")],
        "wrong types": [_chat(r, max_tokens="4"), _chat(r, temperature=[1]), _chat(r, messages="hi")],
        "numeric extremes": [
            _chat(r, max_tokens=10**18),
            _chat(r, temperature=1e308),
            _chat(r, seed=-(2**80)),
        ],
        "long strings": [_chat(r, model="m" * 100_000), _chat(r, stop=["x" * 100_000])],
        "deep nesting": [_raw(r, b'{"messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}")],
        "NUL and unicode": [
            _chat(r, messages=[{"role": "user", "content": "\x00\ud7ff\U0010ffff" * 100}]),
            _raw(r, b'{"model": "default", "messages": [{"role": "user", "content": "\\ud800"}]}'),
        ],
        "bad images": [
            _chat(r, messages=[{"role": "user", "content": [image]}]),
            _chat(
                r,
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
                    }
                ],
            ),
        ],
        "headers and keys": [
            ("POST", "/v1/chat/completions", {"Authorization": "Bearer wrong"}, b"{}"),
            ("POST", "/v1/chat/completions", {**_headers(r), JOB_ARN_HEADER: ""}, b"{}"),
            ("POST", "/v1/chat/completions", {**_headers(r), TRAJECTORY_ID_HEADER: "x" * 10_000}, b"{}"),
        ],
        "admin with the agents' key": [
            ("POST", "/admin/close-job", _headers(r), json.dumps({"job_arn": JOB}).encode()),
            ("POST", "/admin/load-adapter", _headers(r), json.dumps({"path": "/etc"}).encode()),
            (
                "POST",
                "/admin/take-trace",
                _headers(r),
                json.dumps({"job_arn": JOB, "rollout_id": "innocent-0"}).encode(),
            ),
        ],
        "path traversal": [
            ("GET", "/../../etc/passwd", _headers(r), b""),
            ("GET", "/v1/%2e%2e/admin", _headers(r), b""),
        ],
        "template injection": [
            _chat(r, chat_template_kwargs={"chat_template": "{{ 7*7 }}"}),
            _chat(r, messages=[{"role": "user", "content": "{% for x in range(10**9) %}{% endfor %}"}]),
        ],
        "malformed tools": [
            _chat(r, tools=[{"type": "function"}]),
            _chat(r, tools=[{"type": "function", "function": {"name": ""}}]),
            _chat(r, tool_choice={"type": "function", "function": {"name": "nope"}}),
        ],
        "refused fields": [
            _chat(r, n=3),
            _chat(r, response_format={"type": "json_object"}),
            _chat(r, logit_bias={"1": 100}),
        ],
        "feedback with fresh ids": [
            (
                "POST",
                "/update-reward",
                _headers(r),
                json.dumps({"JobArn": JOB, "TrajectoryId": f"{r}-{i}", "Rewards": [1.0]}).encode(),
            )
            for i in range(5)
        ],
        "oversized": [
            _raw(r, b"x" * (17 * MB)),
            _chat(r, messages=[{"role": "user", "content": "word " * (3 * MB)}]),
        ],
        "methods": [
            ("DELETE", "/v1/chat/completions", _headers(r), b""),
            ("PUT", "/health", _headers(r), b""),
        ],
        "streaming": [
            _chat(r, stream=True, stream_options={"include_usage": "yes"}),
            _chat(r, stream="true"),
        ],
    }


def memory_mb(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    return {
        field: int(re.search(rf"^{field}:\s+(\d+) kB$", status, re.M).group(1)) / 1024
        for field in ("VmRSS", "VmHWM")
    }  # type: ignore[union-attr]


def innocent_answers(client: httpx.Client, round_name: str) -> list[list[int]]:
    """Seeded calls of fresh innocent rollouts: the sampled token ids of each."""
    answers = []
    for index in range(4):
        rollout = f"innocent-{round_name}-{index}"
        body = {
            "model": "default",
            "messages": [{"role": "user", "content": f"walk {index}"}],
            "max_tokens": 6,
            "seed": 100 + index,
        }
        response = client.post("/v1/chat/completions", json=body, headers=_headers(rollout))
        response.raise_for_status()
        answers.append(response.json()["choices"][0]["token_ids"])
    return answers


def serve(model_dir: Path) -> Generator[tuple[str, int], None, None]:
    command = [
        sys.executable,
        "-m",
        "handlers.cli",
        "serve",
        "--model",
        str(model_dir),
        "--port",
        "0",
        "--open-job",
        JOB,
    ]
    command += ["--api-key", API_KEY, "--admin-key", ADMIN_KEY, "--log-level", "error", "--max-tokens", "8"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if found := re.search(r"endpoint: (http://\S+)/v1", line):
                yield found.group(1), process.pid
                return
        raise RuntimeError(f"rft serve exited with {process.wait()} before serving")
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)


def attack(client: httpx.Client, repeat: int) -> dict[str, Counter[int]]:
    counts: dict[str, Counter[int]] = {}
    for index in range(repeat):
        for name, requests in categories(index).items():
            for method, path, headers, body in requests:
                status = client.request(method, path, headers=headers, content=body).status_code
                counts.setdefault(name, Counter())[status] += 1
    return counts


def run(repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        model = build_tiny_model(Path(scratch) / "model", seed=0)
        server = serve(model)
        url, pid = next(server)
        try:
            with httpx.Client(base_url=url, timeout=120) as client:
                before_answers = innocent_answers(client, "before")
                warm_up = attack(client, 1)  # the allocator's pools and first batches, not counted
                before = memory_mb(pid)
                started = time.monotonic()
                counts = attack(client, repeat)
                seconds = time.monotonic() - started
                after = memory_mb(pid)
                after_answers = innocent_answers(client, "after")
        finally:
            server.close()
    for name, counter in warm_up.items():
        counts[name].update(counter)
    statuses = Counter[int]()
    for counter in counts.values():
        statuses.update(counter)
    admin_opened = sum(n for s, n in counts["admin with the agents' key"].items() if s < 400)
    result = {
        "requests": sum(statuses.values()),
        "seconds": round(seconds, 1),
        "statuses": dict(sorted(statuses.items())),
        "by_category": {name: dict(sorted(counter.items())) for name, counter in counts.items()},
        "server_5xx": sum(n for s, n in statuses.items() if s >= 500),
        "admin_routes_opened": admin_opened,
        "innocent_rollouts_changed": sum(a != b for a, b in zip(before_answers, after_answers, strict=True)),
        "memory_mb": {"before": before, "after": after, "kept": round(after["VmRSS"] - before["VmRSS"], 1)},
    }
    result["passed"] = (
        result["server_5xx"] == 0
        and admin_opened == 0
        and result["innocent_rollouts_changed"] == 0
        and result["memory_mb"]["kept"] < KEPT_LIMIT_MB
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="rounds of every category (default 20)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "hostile.json")
    args = parser.parse_args(argv)
    result = run(args.repeat)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps(
            {
                key: result[key]
                for key in (
                    "requests",
                    "statuses",
                    "server_5xx",
                    "admin_routes_opened",
                    "innocent_rollouts_changed",
                    "memory_mb",
                    "passed",
                )
            }
        )
    )
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
