"""The checks of a vLLM server rftkit attaches to instead of starting (``vllm.attach_url``, ``rft serve
--vllm-url``): the model name it serves, LoRA with adapters loaded at run time, and raw logprobs.

A server someone else started may lack what a run needs; each lack is found at start and named, with
the flag or variable that adds it, in one refusal, rather than by the first adapter load or, for
logprobs, never: vLLM's ``--logprobs-mode processed_logprobs`` returns the logprobs of the sampling
distribution (after temperature and top-p), and GRPO's ratio compared with the learner's raw
logprobs would be off on every token without an error anywhere.
"""

from __future__ import annotations

import math

import httpx

from policy_server.engines.vllm_server import (
    VLLMEngineError,
    error_message,
    is_missing_route,
    served_base_model,
)

# vLLM's metrics declare this family only when the server runs with --enable-lora.
LORA_METRIC = "vllm:lora_requests_info"
# What vLLM's OpenAI answers put in place of a logprob of -inf.
_NO_LOGPROB = -9999.0
# The probe's nucleus: so small that only the most likely token survives top-p, so a server returning
# the sampling distribution's logprobs gives the runner-up -inf, and one returning the model's its
# own finite logprob.
_PROBE_TOP_P = 1e-6


async def check_attached(client: httpx.AsyncClient, url: str, wanted: str, max_lora_rank: int) -> str:
    """The base model name to call on the server at ``url``; :class:`VLLMEngineError` naming every
    setting it lacks for a run: LoRA, adapters loaded at run time, raw logprobs."""
    models = await client.get("/v1/models", timeout=10.0)
    if models.status_code != 200:
        raise VLLMEngineError(
            f"vLLM at {url} answered GET /v1/models with {models.status_code}: {error_message(models)}"
        )
    name = served_base_model(models.json(), wanted, url)
    lacks = []
    metrics = await client.get("/metrics", timeout=10.0)
    if metrics.status_code == 200 and LORA_METRIC not in metrics.text:
        lacks.append(
            "it was started without LoRA, so it cannot serve the adapters rftkit trains: restart it "
            f"with `--enable-lora --max-lora-rank {max_lora_rank}` and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 "
            "in its environment"
        )
    else:
        probe = await client.post("/v1/unload_lora_adapter", json={"lora_name": "rftkit-probe"})
        if probe.status_code in (404, 405) and is_missing_route(probe):
            lacks.append(
                "it does not load adapters at run time (no /v1/load_lora_adapter): restart it with "
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 in its environment"
            )
    processed = await processed_logprobs(client, url, name)
    if processed is not None:
        lacks.append(
            f"its logprobs are not the model's own ({processed}), and GRPO compares them with the "
            "learner's: restart it with `--logprobs-mode raw_logprobs` (vLLM's default)"
        )
    if lacks:
        raise VLLMEngineError(f"vLLM at {url} cannot sample for a run as started: {'; '.join(lacks)}.")
    return name


async def processed_logprobs(client: httpx.AsyncClient, url: str, model: str) -> str | None:
    """What the server's logprobs are instead of the model's raw log-probabilities (a phrase), or None
    when they are raw. One seeded token, its two most likely candidates' logprobs asked for under a
    top-p that keeps one: raw logprobs stay finite for both and are log-probabilities (their
    exponentials sum to at most 1); processed ones give the runner-up -inf; logits are no
    log-probabilities."""
    body = {
        "model": model,
        "prompt": "Hello",
        "max_tokens": 1,
        "temperature": 1.0,
        "top_p": _PROBE_TOP_P,
        "seed": 0,
        "logprobs": 2,
        # Keys by token id: two tokens that decode to the same text stay two entries.
        "return_tokens_as_token_ids": True,
    }
    answer = await client.post("/v1/completions", json=body, timeout=120.0)
    if answer.status_code != 200:
        raise VLLMEngineError(
            f"vLLM at {url} answered the logprobs check (POST /v1/completions, one token of {model}) "
            f"with {answer.status_code}: {error_message(answer)}"
        )
    (top,) = answer.json()["choices"][0]["logprobs"]["top_logprobs"][:1]
    values = [_NO_LOGPROB if value is None else float(value) for value in top.values()]
    if len(values) < 2 or min(values) <= _NO_LOGPROB:
        return "processed: the runner-up token that top-p left out came back with no logprob"
    largest = max(values)
    if largest + math.log(sum(math.exp(value - largest) for value in values)) > 1e-4:
        return f"logits, not log-probabilities: {', '.join(f'{value:.3g}' for value in values)}"
    return None
