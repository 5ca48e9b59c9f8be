"""An endpoint teacher of distillation against the suite's scripted model server (``tests/scripted_model.py``)
answering vLLM's scoring routes over real HTTP: the request it sends, the scores it reads, the
retries, the tokenizer check and every error's sentence. Scoring against real vLLM, equal to the local
teacher's scores, is in ``tests/policy_server/test_vllm_engine.py`` (that module's vLLM server)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from handlers import serve_in_thread
from policy_server.models import load_tokenizer
from tests.scripted_model import ScriptedModel
from trainer.algo.sequences import TrainingSequence
from trainer.config import ConfigError, DistillationConfig, TrainConfig
from trainer.distill import (
    EndpointTeacher,
    TeacherEndpointError,
    TokenizerMismatch,
    distill_sequences,
    open_teacher,
)

SEQUENCES = [
    TrainingSequence("a", [5, 9, 14, 3, 7, 8], [0, 0, 1, 1, 0, 1], [0.0, 0.0, -1.0, -2.0, 0.0, -0.5]),
    TrainingSequence("b", [4, 4, 11, 12], [0, 1, 1, 1], [0.0, -0.2, -0.3, -0.4]),
]


@pytest.fixture
def served(tiny_model_dir: Path) -> Iterator[tuple[ScriptedModel, str]]:
    """The scripted server with the policy's tokenizer behind /tokenize, and its OpenAI base URL."""
    tokenizer = load_tokenizer(tiny_model_dir)
    scripted = ScriptedModel()
    scripted.tokenize = lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])
    with serve_in_thread(scripted.app()) as url:
        yield scripted, f"{url}/v1"


def _teacher(url: str, policy: Path, **fields: object) -> EndpointTeacher:
    settings = DistillationConfig(teacher=url, teacher_model="big", **fields)  # type: ignore[arg-type]
    return EndpointTeacher(settings, policy, max_retries=2, retry_backoff_s=0.01, batch_tokens=8)


def test_an_endpoint_teacher_scores_with_prompt_logprobs_and_retries_as_agent_calls_do(
    served: tuple[ScriptedModel, str], tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted, url = served
    monkeypatch.setenv("TEACHER_KEY", "k-7")
    scripted.queued = [(503, b'{"error": "busy"}')]  # the tokenizer check is retried once
    distillation = {"teacher": url, "teacher_model": "big", "teacher_api_key_env": "TEACHER_KEY"}
    config = TrainConfig(
        output_dir=tmp_path,
        distillation={**distillation, "reward_weight": 0.0},
        max_retries=2,
        retry_backoff_s=0.01,
        max_tokens_per_microbatch=8,
    )
    # Any learner: the endpoint scores in the trainer's process (a Ray learner's run included).
    teacher = open_teacher(config, tiny_model_dir, learner=None)  # type: ignore[arg-type]
    assert isinstance(teacher, EndpointTeacher) and teacher.endpoint.max_retries == 2
    probe = scripted.scoring[-1].body
    assert probe["model"] == "big" and probe["add_special_tokens"] is False and len(scripted.scoring) == 2

    scripted.queued = [(502, b"bad gateway")]
    assert config.distillation is not None
    figures = distill_sequences(teacher, config.distillation, SEQUENCES)
    requests = [call for call in scripted.scoring if call.body.get("prompt_logprobs") is not None]
    # A budget of 8 tokens: one request per sequence (the first one twice: 502, then scored).
    assert [call.body["prompt"] for call in requests] == [[SEQUENCES[0].token_ids]] * 2 + [
        [SEQUENCES[1].token_ids]
    ]
    assert all(call.body["max_tokens"] == 1 and call.body["prompt_logprobs"] == 0 for call in requests)
    assert {call.headers["authorization"] for call in scripted.scoring} == {"Bearer k-7"}
    for sequence in SEQUENCES:
        expected = [
            scripted.prompt_logprob(token, position) if trained else 0.0
            for position, (token, trained) in enumerate(
                zip(sequence.token_ids, sequence.loss_mask, strict=True)
            )
        ]
        assert sequence.token_advantages == pytest.approx(
            [
                -(student - teacher)
                for student, teacher in zip(sequence.behavior_logprobs, expected, strict=True)
            ],
            abs=1e-6,
        )
    assert figures["teacher_tokens"] == 10 and figures["sampled_tokens"] == 6  # its prefill: every token


def _fails(teacher: EndpointTeacher, *phrases: str) -> str:
    with pytest.raises(TeacherEndpointError) as failed:
        teacher.score(SEQUENCES)
    message = str(failed.value)
    assert teacher.endpoint.url in message and all(phrase in message for phrase in phrases), message
    return message


def test_an_endpoint_teacher_ends_the_step_with_a_sentence_naming_what_went_wrong(
    served: tuple[ScriptedModel, str], tiny_model_dir: Path
) -> None:
    scripted, url = served
    teacher = _teacher(url, tiny_model_dir)
    calls = len(scripted.scoring)
    refusal = {"error": {"message": "This model's maximum context length is 5 tokens", "code": 400}}
    scripted.queued = [(400, json.dumps(refusal).encode())]
    _fails(teacher, "answered 400 to POST /v1/completions", "maximum context length")
    assert len(scripted.scoring) == calls + 1  # a refusal is not retried
    scripted.queued = [(503, b"{}")] * 3
    _fails(teacher, "answered 503", "after 3 attempts")
    scripted.queued = [(200, b"<html>")]
    _fails(teacher, "with what is not JSON")
    scripted.queued = [(200, json.dumps({"choices": [{"index": 0, "prompt_logprobs": [None] * 3}]}).encode())]
    _fails(teacher, "gave 3 prompt logprobs for a sequence of 6 tokens")
    scripted.queued = [(200, json.dumps({"choices": []}).encode())]
    _fails(teacher, "answered 0 choices for 1 sequences")
    scripted.prompt_logprob = lambda token, position: 2.5  # logits, not logprobs
    _fails(teacher, "which is no logprob", "--logprobs-mode")

    slow = dataclasses.replace(teacher.endpoint, timeout_s=0.2, max_retries=0)
    teacher.endpoint, scripted.delay_s = slow, 0.5
    _fails(teacher, "did not answer within 0.2 s (distillation.teacher_timeout_s)", "after 1 attempt ")
    teacher.endpoint = dataclasses.replace(slow, url="http://127.0.0.1:9/v1")  # nothing listens on port 9
    _fails(teacher, "cannot be reached")


def test_an_endpoint_teacher_needs_the_policys_tokenizer_a_vllm_server_and_its_model_name(
    served: tuple[ScriptedModel, str], tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted, url = served
    tokenizer = load_tokenizer(tiny_model_dir)
    scripted.tokenize = lambda text: [
        token + 1 for token in tokenizer(text, add_special_tokens=False)["input_ids"]
    ]
    with pytest.raises(TokenizerMismatch) as refused:
        _teacher(url, tiny_model_dir)
    message = str(refused.value)
    assert f"distillation.teacher {url} (model big) has another tokenizer than the policy" in message
    assert "first apart at token 0" in message and "`rft collect`" in message
    scripted.tokenize = None  # no /tokenize: not a vLLM server
    with pytest.raises(TeacherEndpointError, match="answered 404 to POST /tokenize.*must be a vLLM server"):
        _teacher(url, tiny_model_dir)
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    with pytest.raises(ConfigError, match="names NO_SUCH_KEY, which is not set"):
        _teacher(url, tiny_model_dir, teacher_api_key_env="NO_SUCH_KEY")
    with pytest.raises(ValueError, match="name the model it serves with distillation.teacher_model"):
        DistillationConfig(teacher=url)
    with pytest.raises(ValueError, match="teacher_model apply only to an endpoint teacher"):
        DistillationConfig(teacher=tiny_model_dir, teacher_model="big")
    with pytest.raises(ValueError, match="load the adapter there"):
        DistillationConfig(teacher=url, teacher_model="big", teacher_adapter=tiny_model_dir)
