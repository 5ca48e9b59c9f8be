"""An endpoint teacher: a vLLM server scores the student's tokens with its ``prompt_logprobs``.

For a teacher served elsewhere (too large to load beside the learner, or already running): each
training sequence's ids, the student's prompt and completion exactly as the gateway recorded them,
go to the server as the prompt of a completion of one token with vLLM's ``prompt_logprobs`` (no
alternatives), which returns the logprob of every prompt token given the ones before it: the same
quantity the local teacher computes. The server must read the ids as the student wrote them, so its
tokenizer is checked against the policy's at start: one probe text (the policy's own vocabulary
spelled out, special tokens included) must tokenize to the same ids on both sides (vLLM's
``/tokenize``).

Every call is retried as the agents' calls are (refused, reset, timed out, 429, 502-504; up to the
run's ``max_retries``, waiting :func:`handlers.retry_delay`); any other failure ends the step
with a :class:`TeacherEndpointError` naming the URL and what was wrong.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch

from handlers import RETRYABLE_STATUS, error_message, retry_delay
from policy_server.models import load_tokenizer
from trainer.algo.sequences import TrainingSequence, micro_batches_by_token_budget
from trainer.config import ConfigError, DistillationConfig
from trainer.distill.teacher import tokenizer_mismatch
from trainer.errors import TrainingError

log = logging.getLogger(__name__)

# Ids of the policy's vocabulary spelled out in the tokenizer probe (every n-th id, plus every added
# and special token): enough to see another vocabulary, small enough for one quick request.
PROBE_IDS = 2048
PROBE_PREFIX = "Tokenizer probe: Hello, world! 1234567890 ÄÖÜ ß 東京 😀 def f(x): return {'a': [1, 2]}\n"
# A logprob above this is no logprob: a server started with --logprobs-mode raw_logits sends logits.
LOGPROB_CEILING = 1e-4
NOT_FOUND_HINT = "; the teacher must be a vLLM server, given by its OpenAI base URL (http://host:8000/v1)"


class TeacherEndpointError(TrainingError):
    """The teacher endpoint failed a call (after the retries), or answered what is not a scoring."""


@dataclass(frozen=True)
class Endpoint:
    """Where and how the teacher is called: the URL as configured, the server's root (without /v1),
    the model, the bearer key and the bounds of each call."""

    url: str
    model: str
    timeout_s: float
    max_retries: int
    retry_backoff_s: float
    api_key: str | None = field(default=None, repr=False)

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")

    def client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(
            base_url=self.root, headers=headers, timeout=self.timeout_s, follow_redirects=False
        )


def endpoint_of(settings: DistillationConfig, *, max_retries: int, retry_backoff_s: float) -> Endpoint:
    """The distillation section's endpoint, its key read from the environment variable it names."""
    assert settings.endpoint is not None and settings.teacher_model is not None
    api_key = None
    if settings.teacher_api_key_env is not None:
        api_key = os.environ.get(settings.teacher_api_key_env)
        if not api_key:
            raise ConfigError(
                f"distillation.teacher_api_key_env names {settings.teacher_api_key_env}, which is not set "
                f"(or empty) here: export it with the key of {settings.endpoint}, or unset the field for "
                "an endpoint without a key"
            )
    return Endpoint(
        settings.endpoint,
        settings.teacher_model,
        settings.teacher_timeout_s,
        max_retries,
        retry_backoff_s,
        api_key,
    )


def post_json(client: httpx.Client, endpoint: Endpoint, path: str, body: dict[str, Any]) -> Any:
    """POST ``body`` to ``path`` and return the answer's JSON, retrying failures in transport with
    backoff up to ``endpoint.max_retries`` times; :class:`TeacherEndpointError` otherwise."""
    jitter = random.Random()
    attempts = 0
    while True:
        attempts += 1
        try:
            response = client.post(path, json=body)
        except httpx.TimeoutException:
            failure = f"did not answer within {endpoint.timeout_s:g} s (distillation.teacher_timeout_s)"
        except httpx.TransportError as error:
            failure = f"cannot be reached ({error!r})"
        else:
            if response.status_code not in RETRYABLE_STATUS:
                return _read(response, endpoint, path)
            failure = f"answered {response.status_code}: {error_message(response.content)}"
        if attempts > endpoint.max_retries:
            raise TeacherEndpointError(
                f"the distillation teacher {endpoint.url} {failure} on POST {path}, after {attempts} "
                f"attempt{'s' if attempts > 1 else ''} (max_retries bounds them)"
            )
        log.warning("distillation teacher %s %s on POST %s; retrying", endpoint.url, failure, path)
        time.sleep(retry_delay(endpoint.retry_backoff_s, attempts, jitter))


def _read(response: httpx.Response, endpoint: Endpoint, path: str) -> Any:
    where = f"the distillation teacher {endpoint.url} (model {endpoint.model})"
    if response.status_code >= 400:
        hint = NOT_FOUND_HINT if response.status_code == 404 else ""
        raise TeacherEndpointError(
            f"{where} answered {response.status_code} to POST {path}: {error_message(response.content)}{hint}"
        )
    try:
        return response.json()
    except ValueError:
        raise TeacherEndpointError(
            f"{where} answered POST {path} with what is not JSON: {response.content[:200]!r}"
        ) from None


def probe_text(policy_dir: str | Path) -> tuple[str, list[int]]:
    """A text that spells out the policy's vocabulary (every n-th token, and every added and special
    one), and the ids the policy's tokenizer gives it."""
    tokenizer = load_tokenizer(policy_dir)
    vocabulary = sorted(set(tokenizer.get_vocab().values()))
    stride = max(1, len(vocabulary) // PROBE_IDS)
    ids = sorted(set(vocabulary[::stride]) | set(tokenizer.get_added_vocab().values()))
    text = PROBE_PREFIX + tokenizer.decode(ids)
    return text, list(tokenizer(text, add_special_tokens=False)["input_ids"])


def check_endpoint_tokenizer(client: httpx.Client, endpoint: Endpoint, policy_dir: str | Path) -> None:
    """Raise :class:`~trainer.distill.teacher.TokenizerMismatch` unless the endpoint's model tokenizes
    the probe text to the ids the policy's tokenizer gives it."""
    text, expected = probe_text(policy_dir)
    body = {"model": endpoint.model, "prompt": text, "add_special_tokens": False}
    answer = post_json(client, endpoint, "/tokenize", body)
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list):
        raise TeacherEndpointError(
            f"the distillation teacher {endpoint.url} answered /tokenize without a list of tokens: "
            f"{str(answer)[:200]}{NOT_FOUND_HINT}"
        )
    if tokens == expected:
        return
    first = next(
        (index for index, (a, b) in enumerate(zip(expected, tokens, strict=False)) if a != b),
        min(len(expected), len(tokens)),
    )
    policy_id = expected[first] if first < len(expected) else "none"
    teacher_id = tokens[first] if first < len(tokens) else "none"
    raise tokenizer_mismatch(
        f"{endpoint.url} (model {endpoint.model})",
        policy_dir,
        f"a probe text of the policy's vocabulary is {len(expected)} tokens here and {len(tokens)} "
        f"there, first apart at token {first}: policy id {policy_id}, teacher id {teacher_id}",
    )


def scoring_body(model: str, sequences: Sequence[TrainingSequence]) -> dict[str, Any]:
    """The completion request that scores ``sequences``: their ids as prompts, one greedy token each,
    and the logprob of every prompt token (vLLM's ``prompt_logprobs``, without alternatives)."""
    return {
        "model": model,
        "prompt": [list(sequence.token_ids) for sequence in sequences],
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 0,
    }


def read_scores(answer: Any, sequences: Sequence[TrainingSequence], url: str) -> list[torch.Tensor]:
    """The teacher's logprob of each sequence's sampled tokens (0 off the loss mask), one float32
    tensor per sequence, from the completion answer to :func:`scoring_body`."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or len(choices) != len(sequences):
        count = len(choices) if isinstance(choices, list) else "no"
        raise TeacherEndpointError(
            f"the distillation teacher {url} answered {count} choices for {len(sequences)} sequences"
        )
    ordered = sorted(choices, key=lambda choice: int(choice.get("index", 0)))
    return [
        _sequence_scores(choice, sequence, url) for choice, sequence in zip(ordered, sequences, strict=True)
    ]


def _sequence_scores(choice: dict[str, Any], sequence: TrainingSequence, url: str) -> torch.Tensor:
    entries = choice.get("prompt_logprobs")
    where = f"the distillation teacher {url} (rollout {sequence.rollout_id})"
    if not isinstance(entries, list) or len(entries) != len(sequence):
        count = len(entries) if isinstance(entries, list) else "no"
        raise TeacherEndpointError(
            f"{where} gave {count} prompt logprobs for a sequence of {len(sequence)} tokens (vLLM's "
            "prompt_logprobs give one per token: is it a vLLM server?)"
        )
    scores = torch.zeros(len(sequence), dtype=torch.float32)
    for position, (token, trained) in enumerate(zip(sequence.token_ids, sequence.loss_mask, strict=True)):
        if not trained:
            continue
        entry = entries[position] if isinstance(entries[position], dict) else {}
        value = entry.get(str(token))
        logprob = value.get("logprob") if isinstance(value, dict) else None
        if not isinstance(logprob, int | float) or math.isnan(logprob):
            raise TeacherEndpointError(f"{where} gave no logprob of token {token} at position {position}")
        if logprob > LOGPROB_CEILING:
            raise TeacherEndpointError(
                f"{where} gave {logprob} for token {token} at position {position}, which is no logprob: "
                "start vLLM with --logprobs-mode raw_logprobs (its default), not raw_logits"
            )
        scores[position] = float(logprob)
    return scores


class EndpointTeacher:
    """A teacher behind a vLLM server: :meth:`score` gives its logprob of each sampled token, as
    :class:`~trainer.distill.teacher.Teacher` does for a local model."""

    def __init__(
        self,
        settings: DistillationConfig,
        policy_dir: str | Path,
        *,
        max_retries: int,
        retry_backoff_s: float,
        batch_tokens: int,
    ) -> None:
        self.endpoint = endpoint_of(settings, max_retries=max_retries, retry_backoff_s=retry_backoff_s)
        self.batch_tokens = batch_tokens
        with self.endpoint.client() as client:
            check_endpoint_tokenizer(client, self.endpoint, policy_dir)
        log.info(
            "distillation teacher %s (model %s): tokenizer checked", self.endpoint.url, settings.teacher_model
        )

    def score(self, sequences: Sequence[TrainingSequence]) -> list[torch.Tensor]:
        """The teacher's logprob of each sequence's tokens, one 1-D float32 CPU tensor per sequence
        (its length; 0 off the loss mask), in ``sequences``' order: one request per batch of
        sequences within ``batch_tokens``."""
        with_images = [sequence.rollout_id for sequence in sequences if sequence.images]
        if with_images:
            raise TrainingError(
                f"rollout {with_images[0]} has images: an endpoint teacher scores text sequences only"
            )
        scored: dict[int, torch.Tensor] = {}
        with self.endpoint.client() as client:
            for batch in micro_batches_by_token_budget(sequences, self.batch_tokens):
                answer = post_json(
                    client, self.endpoint, "/v1/completions", scoring_body(self.endpoint.model, batch)
                )
                for sequence, scores in zip(
                    batch, read_scores(answer, batch, self.endpoint.url), strict=True
                ):
                    scored[id(sequence)] = scores
        return [scored[id(sequence)] for sequence in sequences]
