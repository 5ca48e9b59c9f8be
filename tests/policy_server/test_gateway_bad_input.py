"""Bad input at the gateway: every refusal is a 4xx with a sentence, the server keeps serving, and other
rollouts' traces and the job's counters stay right."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handlers.protocol import JOB_ARN_HEADER, JOB_NOT_FOUND_MESSAGE, TRAJECTORY_ID_HEADER
from policy_server import PolicyServer, ServerThread
from policy_server.engines.hf import HFEngine

API_KEY = "test-key"
ADMIN_KEY = "test-admin-key"
JOB = "arn:aws:sagemaker:us-west-2:123456789012:training-job/bad-input"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MAX_TOKENS_CAP = 4
MAX_CALLS = 3
BODY_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[tuple[PolicyServer, ServerThread]]:
    server = PolicyServer(
        HFEngine(tiny_model_dir), api_key=API_KEY, admin_key=ADMIN_KEY, max_body_bytes=BODY_LIMIT
    )
    thread = ServerThread(server).start()
    try:
        yield server, thread
    finally:
        thread.stop()


def _headers(rollout_id: str | None, job_arn: str | None = JOB) -> dict[str, str]:
    headers = dict(AUTH)
    if job_arn is not None:
        headers[JOB_ARN_HEADER] = job_arn
    if rollout_id is not None:
        headers[TRAJECTORY_ID_HEADER] = rollout_id
    return headers


def _chat(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "default",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 2,
    }
    body.update(overrides)
    return body


def _message(response: httpx.Response) -> str:
    error = response.json()["error"]
    return error["message"] if isinstance(error, dict) else error


def _assert_refused(response: httpx.Response, status: int | None = None) -> str:
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    if status is not None:
        assert response.status_code == status, response.text
    message = _message(response)
    # A sentence: capitalised words (the job-not-found one is the service's verbatim, without a period).
    assert message[:1].isupper() and len(message.split()) >= 3, message
    return message


def test_hand_written_bad_requests_answer_4xx_sentences_and_leave_others_untouched(
    served: tuple[PolicyServer, ServerThread],
) -> None:
    server, thread = served
    server.open_job(JOB, max_tokens=MAX_TOKENS_CAP, max_calls_per_rollout=MAX_CALLS)
    for rollout_id in ("good", "victim", "capped", "finished"):
        server.open_rollout(JOB, rollout_id)
    url = f"{thread.url}/v1/chat/completions"
    rejected_in_job = 0
    with httpx.Client(timeout=30) as client:

        def post(
            rollout_id: str | None, body: Any = None, *, raw: bytes | None = None, **kwargs: Any
        ) -> httpx.Response:
            content = raw if raw is not None else json.dumps(body if body is not None else _chat()).encode()
            headers = kwargs.pop("headers", None) or _headers(rollout_id)
            return client.post(url, content=content, headers={"Content-Type": "application/json", **headers})

        assert post("good").status_code == 200
        victim_before = post("victim").json()

        cases: list[tuple[str, httpx.Response, int]] = [
            ("malformed JSON", post("good", raw=b'{"model": "default", "messages": ['), 400),
            ("not an object", post("good", raw=b"[1, 2]"), 400),
            ("max_tokens as string", post("good", _chat(max_tokens="2")), 400),
            ("messages not a list", post("good", _chat(messages="hello")), 400),
            ("empty messages", post("good", _chat(messages=[])), 400),
            ("unknown role", post("good", _chat(messages=[{"role": "robot", "content": "x"}])), 400),
            (
                "content part of unknown type",
                post("good", _chat(messages=[{"role": "user", "content": [{"type": "audio"}]}])),
                400,
            ),
            ("temperature out of range", post("good", _chat(temperature=7.5)), 400),
            ("n above 1", post("good", _chat(n=2)), 400),
            ("max_tokens above cap", post("good", _chat(max_tokens=MAX_TOKENS_CAP + 1)), 400),
            ("unknown model", post("good", _chat(model="gpt-9")), 404),
            (
                "image to a text-only engine",
                post(
                    "good",
                    _chat(
                        messages=[
                            {
                                "role": "user",
                                "content": [
                                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
                                ],
                            }
                        ]
                    ),
                ),
                400,
            ),
            ("oversized body", post("good", raw=b'{"model": "' + b"x" * (BODY_LIMIT + 1) + b'"}'), 413),
            ("unknown rollout", post("nobody"), 404),
            ("missing trajectory header", post(None), 400),
        ]
        rejected_in_job += len(cases)
        rejected_in_good = len(cases) - 2  # all but the unknown-rollout and missing-header ones

        # Too many calls: the third call of "capped" is its last allowed one.
        for _ in range(MAX_CALLS):
            assert post("capped").status_code == 200
        cases.append(("too many calls", post("capped"), 400))
        rejected_in_job += 1

        server.take_trace(JOB, "finished")
        cases.append(("finished rollout", post("finished"), 409))
        rejected_in_job += 1

        # Refusals outside any open job: not counted against this job.
        unknown_job = post(
            "good", headers=_headers("good", job_arn="arn:aws:sagemaker:us-west-2:1:training-job/nope")
        )
        missing_job = post("good", headers=_headers("good", job_arn=None))
        bad_key = post("good", headers={**_headers("good"), "Authorization": "Bearer wrong"})
        no_key = client.get(f"{thread.url}/health")
        admin_no_key = client.post(f"{thread.url}/admin/open-job", json={"job_arn": "x"})

        assert _assert_refused(unknown_job, 400) == JOB_NOT_FOUND_MESSAGE
        _assert_refused(missing_job, 400)
        _assert_refused(bad_key, 401)
        _assert_refused(no_key, 401)
        _assert_refused(admin_no_key, 401)
        agent_key_on_admin = client.post(f"{thread.url}/admin/open-job", json={"job_arn": "x"}, headers=AUTH)
        assert "agents' key" in _assert_refused(agent_key_on_admin, 403)
        for name, response, status in cases:
            message = _assert_refused(response, status)
            print(f"{name}: {response.status_code} {message}")

        # Still serving, and the victim rollout's trace holds exactly its own call.
        assert client.get(f"{thread.url}/health", headers=AUTH).status_code == 200
        assert post("good").status_code == 200
        victim = server.take_trace(JOB, "victim")
        assert [call.prompt_token_ids for call in victim.calls] == [victim_before["prompt_token_ids"]]
        assert victim.calls[0].completion_token_ids == victim_before["choices"][0]["token_ids"]
        assert victim.rejected_calls == 0

    good, capped = server.take_trace(JOB, "good"), server.take_trace(JOB, "capped")
    assert len(good.calls) == 2 and len(capped.calls) == MAX_CALLS
    assert capped.rejected_calls == 1
    assert good.rejected_calls == rejected_in_good
    counters = server.close_job(JOB)
    calls = good.calls + capped.calls + victim.calls
    assert counters.calls == len(calls) == 6
    assert counters.prefill_tokens == sum(len(call.prompt_token_ids) for call in calls)
    assert counters.sample_tokens == sum(len(call.completion_token_ids) for call in calls)
    assert counters.rejected_calls == rejected_in_job


def test_openai_client_surfaces_could_not_find_job(served: tuple[PolicyServer, ServerThread]) -> None:
    _, thread = served
    client = openai.OpenAI(
        base_url=f"{thread.url}/v1",
        api_key=API_KEY,
        default_headers={JOB_ARN_HEADER: "arn:made-up", TRAJECTORY_ID_HEADER: "r"},
        max_retries=0,
    )
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}])
    assert JOB_NOT_FOUND_MESSAGE in str(caught.value)
    assert caught.value.status_code == 400


def test_feedback_and_admin_routes_refuse_bad_bodies(served: tuple[PolicyServer, ServerThread]) -> None:
    server, thread = served
    job = JOB + "-feedback"
    admin_auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with (
        httpx.Client(base_url=thread.url, headers=AUTH, timeout=30) as client,
        httpx.Client(base_url=thread.url, headers=admin_auth, timeout=30) as admin,
    ):
        assert admin.post("/admin/open-job", json={"job_arn": job, "max_tokens": 2}).status_code == 200
        assert admin.post("/admin/open-rollout", json={"job_arn": job, "rollout_id": "r"}).status_code == 200
        refusals = [
            admin.post("/admin/open-job", json={"job_arn": job}),  # already open
            admin.post("/admin/open-job", json={"job_arn": job + "2", "max_tokens": "many"}),
            admin.post("/admin/open-rollout", json={"job_arn": job, "rollout_id": "r"}),  # single-use ids
            admin.post("/admin/take-trace", json={"job_arn": job, "rollout_id": "other"}),
            admin.post("/admin/load-adapter", json={"path": "/nonexistent/adapter"}),
            admin.get("/admin/counters"),
            client.post("/complete-rollout", json={"JobArn": job, "TrajectoryId": "r", "Status": "done"}),
            client.post("/complete-rollout", content=b"{not json"),
            client.post("/update-reward", json={"JobArn": job, "TrajectoryId": "r", "Rewards": []}),
            client.post("/update-reward", json={"JobArn": "unknown", "TrajectoryId": "r", "Rewards": [1.0]}),
            client.post("/update-reward", json={"JobArn": job, "TrajectoryId": "zzz", "Rewards": [1.0]}),
            client.get("/no/such/route"),
            client.get("/v1/chat/completions"),
        ]
        for response in refusals:
            _assert_refused(response)
        assert _message(refusals[9]) == JOB_NOT_FOUND_MESSAGE
        assert client.post(
            "/complete-rollout", json={"JobArn": job, "TrajectoryId": "r", "Status": "ready"}
        ).is_success
        assert client.post(
            "/update-reward", json={"JobArn": job, "TrajectoryId": "r", "Rewards": [0.5, 1]}
        ).is_success
        trace = admin.post("/admin/take-trace", json={"job_arn": job, "rollout_id": "r"}).json()
        assert (trace["status"], trace["rewards"], trace["calls"]) == ("ready", [0.5, 1.0], [])
        assert admin.get("/admin/counters", params={"job_arn": job}).json()["calls"] == 0
        assert admin.post("/admin/close-job", json={"job_arn": job}).status_code == 200
        assert _message(admin.get("/admin/counters", params={"job_arn": job})) == JOB_NOT_FOUND_MESSAGE


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
_FIELDS = [
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "n",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "reasoning_effort",
    "chat_template_kwargs",
    "logprobs",
    "top_logprobs",
    "response_format",
    "logit_bias",
    "frequency_penalty",
    "presence_penalty",
    "modalities",
    "audio",
    "prediction",
    "web_search_options",
    "user",
    "store",
    "metadata",
    "service_tier",
    "parallel_tool_calls",
]


@st.composite
def _mutated_requests(draw: st.DrawFn) -> bytes:
    """A valid request with one field replaced by arbitrary JSON, or garbage bytes."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=40))
    body = _chat()
    field = draw(st.sampled_from(_FIELDS + ["messages.0.role", "messages.0.content", "messages.0"]))
    value = draw(_JSON)
    if field.startswith("messages."):
        parts = field.split(".")
        if len(parts) == 2:
            body["messages"][0] = value
        else:
            body["messages"][0][parts[2]] = value
    else:
        body[field] = value
    return json.dumps(body).encode()


def test_arbitrary_requests_never_break_the_server(served: tuple[PolicyServer, ServerThread]) -> None:
    """Hypothesis, in process through httpx.ASGITransport on the server's own loop: every answer is a
    success or a 4xx with a sentence, never a 5xx; other rollouts stay untouched."""
    server, thread = served
    job = JOB + "-hypothesis"
    server.open_job(job, max_tokens=MAX_TOKENS_CAP, max_calls_per_rollout=10_000)
    server.open_rollout(job, "fuzz")
    server.open_rollout(job, "bystander")
    headers = {**_headers("fuzz", job), "Content-Type": "application/json"}
    statuses: dict[int, int] = {}

    async def send(body: bytes) -> httpx.Response:
        transport = httpx.ASGITransport(app=server.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            return await client.post("/v1/chat/completions", content=body, headers=headers)

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_mutated_requests())
    def check(body: bytes) -> None:
        response = thread.run(send(body), timeout=60)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        if response.status_code != 200:
            _assert_refused(response)

    check()
    print("statuses:", statuses)
    assert statuses.get(200, 0) > 0 and sum(n for s, n in statuses.items() if s != 200) > 0
    assert server.take_trace(job, "bystander").calls == []
    fuzz = server.take_trace(job, "fuzz")
    counters = server.close_job(job)
    assert counters.calls == len(fuzz.calls)
    assert counters.rejected_calls == fuzz.rejected_calls == sum(n for s, n in statuses.items() if s != 200)
