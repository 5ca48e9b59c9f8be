"""``rft smoke``: every outcome produced by a real server on loopback (or, for runtime ARNs, by botocore's
Stubber on the real bedrock-agentcore service model) and classified right."""

from __future__ import annotations

import io
import json
import socket
import threading
from pathlib import Path
from typing import Any

import boto3
import openai
import pytest
from bedrock_agentcore.runtime import BedrockAgentCoreApp
from botocore.response import StreamingBody
from botocore.stub import ANY, Stubber
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from handlers import RolloutContext, rft_app
from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER, RolloutPayload
from handlers.smoke import (
    BUILTIN_PAYLOAD,
    HEALTHY_SENTENCE,
    NOT_STARTING_SENTENCE,
    Outcome,
    smoke_arn,
    smoke_url,
)
from handlers.smoke_cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATE_PAYLOAD = REPO_ROOT / "agents" / "template" / "payloads" / "smoke.json"
ARN = "arn:aws:bedrock-agentcore:us-west-2:111122223333:runtime/template-abc123"
PAYLOAD = RolloutPayload.model_validate(BUILTIN_PAYLOAD)


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_a_healthy_agent_is_told_so(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from agents.template.main import NO_PLAY_REWARD, app

    exit_code = main([serve(app), "--payload", str(TEMPLATE_PAYLOAD), "--timeout", "30"])
    printed = capsys.readouterr().out
    assert exit_code == 0, printed
    assert f"HEALTHY: the agent came back with its no-play reward {NO_PLAY_REWARD:g}" in printed
    assert f"400 'Could not find job' (no job of that id is served): {HEALTHY_SENTENCE}" in printed
    assert f"reward {NO_PLAY_REWARD:g}" in printed
    assert "1 with this rollout's" in printed and "complete-rollout: ['ready']" in printed


def test_403_is_access_denied(serve: Any) -> None:
    async def invocations(request: Request) -> JSONResponse:
        if request.headers.get("authorization") != "Bearer right-key":
            return JSONResponse({"error": "the token is for another account"}, status_code=403)
        return JSONResponse({"reward": 0.0})

    url = serve(Starlette(routes=[Route("/invocations", invocations, methods=["POST"])]))
    report = smoke_url(url, PAYLOAD, timeout=10)
    assert report.outcome is Outcome.ACCESS_DENIED and report.exit_code == 4
    assert "another account or job" in report.verdict
    assert "the token is for another account" in report.render()


def test_connection_refused_says_nothing_listens_at_the_url() -> None:
    # A wrong URL (or an agent not started) is not a server failing to start: say what is there.
    url = closed_port_url()
    report = smoke_url(url, PAYLOAD, timeout=5)
    assert report.outcome is Outcome.NOT_REACHABLE and report.exit_code == 5
    assert report.verdict.startswith(f"nothing listens at {url} (connection refused): check the URL's host")
    assert "could not connect" in report.observations[0]


def test_a_host_that_does_not_resolve_is_named() -> None:
    report = smoke_url("http://no-such-agent.invalid:8080", PAYLOAD, timeout=5)
    assert report.outcome is Outcome.NOT_REACHABLE
    assert report.verdict.startswith(
        "the host 'no-such-agent.invalid' of http://no-such-agent.invalid:8080 is not found"
    )


def test_no_answer_in_time_means_the_server_is_not_starting(serve: Any) -> None:
    release = threading.Event()

    def stuck(row: Any, ctx: RolloutContext) -> float:
        release.wait(10)
        return 0.0

    url = serve(rft_app(stuck))
    try:
        report = smoke_url(url, PAYLOAD, timeout=0.5)
    finally:
        release.set()
    assert report.outcome is Outcome.NOT_REACHABLE and report.verdict == NOT_STARTING_SENTENCE
    assert "no answer" in report.observations[0] and "within 0.5 s" in report.observations[0]


def test_a_dropped_connection_is_an_agent_error() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def drop() -> None:
            connection, _ = listener.accept()
            connection.recv(65536)
            connection.close()

        dropper = threading.Thread(target=drop, daemon=True)
        dropper.start()
        report = smoke_url(f"http://127.0.0.1:{listener.getsockname()[1]}", PAYLOAD, timeout=5)
        dropper.join(5)
    assert report.outcome is Outcome.AGENT_ERROR and "did it crash?" in report.verdict
    assert (
        "the connection to http://127.0.0.1:" in report.observations[0] and "broke" in report.observations[0]
    )


def test_an_agent_error_is_shown(serve: Any) -> None:
    def broken(row: Any, ctx: RolloutContext) -> float:
        raise KeyError("question")

    report = smoke_url(serve(rft_app(broken)), PAYLOAD, timeout=10)
    assert report.outcome is Outcome.AGENT_ERROR and report.exit_code == 3
    assert "agent answered HTTP 500: KeyError: 'question'" in report.observations[0]


def test_an_agent_without_aws_credentials_is_told_to_get_some(serve: Any) -> None:
    def unsigned(row: Any, ctx: RolloutContext) -> float:
        # What AWS's SDK raises when it cannot sign its bearer token.
        raise RuntimeError("No AWS credentials found. Check your environment or credential provider.")

    report = smoke_url(serve(rft_app(unsigned)), PAYLOAD, timeout=10)
    assert report.outcome is Outcome.AGENT_ERROR
    assert "no AWS credentials to sign with" in report.verdict
    assert "any, for a local run (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION)" in report.verdict


def test_an_escaped_could_not_find_job_gets_its_own_advice(serve: Any) -> None:
    def unguarded(row: Any, ctx: RolloutContext) -> float:
        with ctx.openai_client() as client:
            client.chat.completions.create(model=ctx.model_id, messages=[{"role": "user", "content": "hi"}])
        return 1.0

    report = smoke_url(serve(rft_app(unguarded)), PAYLOAD, timeout=10)
    assert report.outcome is Outcome.AGENT_ERROR
    assert "catch the model's 400 and return the no-play reward" in report.verdict


def test_a_reward_without_any_model_call_is_partial(serve: Any) -> None:
    report = smoke_url(serve(rft_app(lambda row, ctx: -1.0)), PAYLOAD, timeout=10)
    assert report.outcome is Outcome.PARTIAL and report.exit_code == 1
    assert "never called the model endpoint" in report.verdict
    assert report.reward == -1.0


def test_model_calls_without_the_rollout_headers_are_partial(serve: Any) -> None:
    def headerless(row: Any, ctx: RolloutContext) -> float:
        client = openai.OpenAI(base_url=f"{ctx.endpoint}/v1", api_key="k")
        try:
            client.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}])
        except openai.BadRequestError:
            return -1.0
        return 0.0

    report = smoke_url(serve(rft_app(headerless)), PAYLOAD, timeout=10)
    assert report.outcome is Outcome.PARTIAL
    assert "lacked this rollout's headers" in report.verdict


def test_a_plain_entrypoint_that_never_reports_is_partial(serve: Any) -> None:
    app = BedrockAgentCoreApp()

    @app.entrypoint
    def invocations(payload: dict[str, Any]) -> dict[str, Any]:
        metadata = payload["metadata"]
        headers = {JOB_ARN_HEADER: metadata["jobArn"], TRAJECTORY_ID_HEADER: metadata["rolloutId"]}
        client = openai.OpenAI(base_url=f"{metadata['endpoint']}/v1", api_key="k", default_headers=headers)
        try:
            client.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}])
        except openai.BadRequestError:
            return {"reward": -1.0}
        return {"reward": 0.0}

    report = smoke_url(serve(app), PAYLOAD, timeout=10)
    assert report.outcome is Outcome.PARTIAL
    assert "no update-reward" in report.verdict and "no complete-rollout" in report.verdict
    assert "1 with this rollout's" in report.render()


def test_an_answer_without_a_reward_is_partial(serve: Any) -> None:
    report = smoke_url(serve(rft_app(lambda row, ctx: {"status": "skipped"})), PAYLOAD, timeout=10)
    assert report.outcome is Outcome.PARTIAL and "without a reward" in report.verdict


# --- AgentCore runtime ARNs, through the real service model -------------------------------------------


@pytest.fixture
def agentcore() -> Any:
    client = boto3.client(
        "bedrock-agentcore", region_name="us-west-2", aws_access_key_id="x", aws_secret_access_key="y"
    )
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


def expected_request() -> dict[str, Any]:
    return {
        "agentRuntimeArn": ARN,
        "runtimeSessionId": ANY,
        "payload": json.dumps(PAYLOAD.to_wire()).encode(),
        "contentType": "application/json",
        "accept": "application/json",
    }


def streamed(body: dict[str, Any], status_code: int = 200) -> dict[str, Any]:
    raw = json.dumps(body).encode()
    return {
        "response": StreamingBody(io.BytesIO(raw), len(raw)),
        "contentType": "application/json",
        "statusCode": status_code,
        "runtimeSessionId": "s" * 40,
    }


def test_a_runtime_answering_a_reward_is_healthy_with_what_could_not_be_verified(agentcore: Any) -> None:
    client, stubber = agentcore
    answer = {"status": "ready", "reward": -1.5, "rewards": [-1.5], "metrics": {}}
    stubber.add_response("invoke_agent_runtime", streamed(answer), expected_request())
    report = smoke_arn(ARN, PAYLOAD, timeout=10, client=client)
    assert report.outcome is Outcome.HEALTHY and report.exit_code == 0 and report.reward == -1.5
    rendered = report.render()
    assert "not verified: that the agent called the model endpoint with the rollout's headers" in rendered
    assert "not verified: that it posted update-reward and complete-rollout" in rendered


def test_a_runtime_access_denied_is_403(agentcore: Any) -> None:
    client, stubber = agentcore
    stubber.add_client_error(
        "invoke_agent_runtime",
        service_error_code="AccessDeniedException",
        service_message="User is not authorized to perform bedrock-agentcore:InvokeAgentRuntime",
        http_status_code=403,
        expected_params=expected_request(),
    )
    report = smoke_arn(ARN, PAYLOAD, timeout=10, client=client)
    assert report.outcome is Outcome.ACCESS_DENIED and "not authorized" in report.render()


def test_a_runtime_client_error_is_an_agent_error(agentcore: Any) -> None:
    client, stubber = agentcore
    stubber.add_client_error(
        "invoke_agent_runtime",
        service_error_code="RuntimeClientError",
        service_message="the container exited",
        http_status_code=424,
    )
    report = smoke_arn(ARN, PAYLOAD, timeout=10, client=client)
    assert report.outcome is Outcome.AGENT_ERROR
    assert "RuntimeClientError (HTTP 424): the container exited" in report.render()


def test_an_agent_error_passed_through_the_runtime_is_shown(agentcore: Any) -> None:
    client, stubber = agentcore
    stubber.add_response("invoke_agent_runtime", streamed({"error": "ValueError: bad row"}, 500))
    report = smoke_arn(ARN, PAYLOAD, timeout=10, client=client, qualifier="DEFAULT")
    assert report.outcome is Outcome.AGENT_ERROR and "HTTP 500: ValueError: bad row" in report.render()


# --- the command line --------------------------------------------------------------------------------


def test_the_payload_comes_from_payloads_smoke_json_in_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([closed_port_url(), "--timeout", "2"]) == 5
    assert "sending the built-in smoke payload" in capsys.readouterr().out
    (tmp_path / "payloads").mkdir()
    (tmp_path / "payloads" / "smoke.json").write_text(TEMPLATE_PAYLOAD.read_text())
    assert main([closed_port_url(), "--timeout", "2"]) == 5
    assert "sending payloads/smoke.json (job" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read the payload file"),
        ("{not json", "is not JSON"),
        ('{"prompt": "x", "metadata": {"jobArn": "j"}}', "metadata.rolloutId: Field required"),
    ],
)
def test_a_bad_payload_file_stops_the_check(
    content: str | None, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "smoke.json"
    if content is not None:
        path.write_text(content)
    assert main(["http://127.0.0.1:1", "--payload", str(path)]) == 2
    assert message in capsys.readouterr().out


def test_a_target_that_is_neither_url_nor_arn_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["localhost:8080"]) == 2
    assert "TARGET must be an http(s) URL or an AgentCore runtime ARN" in capsys.readouterr().out
    assert main(["http://[::1"]) == 2
    assert "is not a valid URL" in capsys.readouterr().out


def test_an_arn_without_aws_credentials_cannot_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert main([ARN, "--endpoint", "https://policy.example.com/v1", "--timeout", "5"]) == 2
    assert "cannot call AgentCore: Unable to locate credentials" in capsys.readouterr().out


def test_with_endpoint_replaces_only_the_endpoint() -> None:
    from handlers.smoke import with_endpoint

    changed = with_endpoint(PAYLOAD, "https://policy.example.com/v1/")
    assert changed.metadata.endpoint == "https://policy.example.com"
    assert changed.metadata.rollout_id == PAYLOAD.metadata.rollout_id and changed.prompt == PAYLOAD.prompt
    assert PAYLOAD.metadata.endpoint is None
