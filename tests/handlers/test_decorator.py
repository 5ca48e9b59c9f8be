"""``@rft_handler`` and ``rft_app`` on a real BedrockAgentCoreApp, called in process (httpx.ASGITransport)
with the feedback posts going to a recording server on loopback."""

from __future__ import annotations

import asyncio
import inspect
import math
from typing import Any

import httpx
import pytest
from bedrock_agentcore.runtime import BedrockAgentCoreApp

from handlers import RolloutContext, rft_app, rft_handler


def invoke(app: Any, body: Any) -> httpx.Response:
    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent", timeout=30) as client:
            return await client.post("/invocations", json=body)

    return asyncio.run(run())


def returning(value: Any, *, use_async: bool) -> Any:
    if use_async:

        async def rollout(row: Any, ctx: RolloutContext) -> Any:
            return value

        return rollout

    def rollout_sync(row: Any, ctx: RolloutContext) -> Any:
        return value

    return rollout_sync


RESULT_SHAPES = [
    (0.75, {"status": "ready", "reward": 0.75, "rewards": [0.75], "metrics": {}}, [0.75]),
    (2, {"status": "ready", "reward": 2.0, "rewards": [2.0], "metrics": {}}, [2.0]),
    (
        [0.5, -0.25, 1.0],
        {"status": "ready", "reward": 1.25, "rewards": [0.5, -0.25, 1.0], "metrics": {}},
        [0.5, -0.25, 1.0],
    ),
    (
        {"reward": 1.5, "metrics": {"turns": 3, "won": True}},
        {"status": "ready", "reward": 1.5, "rewards": [1.5], "metrics": {"turns": 3.0, "won": 1.0}},
        [1.5],
    ),
    (
        {"reward": [1.0, 2.0], "metrics": {"x": 0.5}, "secret": "crane"},
        {"status": "ready", "reward": 3.0, "rewards": [1.0, 2.0], "metrics": {"x": 0.5}, "secret": "crane"},
        [1.0, 2.0],
    ),
]


@pytest.mark.parametrize("use_async", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize(("returned", "answer", "reported"), RESULT_SHAPES)
def test_each_result_shape_is_answered_and_reported(
    returned: Any, answer: dict[str, Any], reported: list[float], use_async: bool, model: Any, payload: Any
) -> None:
    response = invoke(rft_app(returning(returned, use_async=use_async)), payload("r1", model.url))
    assert response.status_code == 200
    assert response.json() == answer
    rewards, completions = model.reports("r1")
    assert [r["Rewards"] for r in rewards] == [reported]
    assert [(c["JobArn"], c["Status"]) for c in completions] == [
        ("arn:aws:sagemaker:us-west-2:111122223333:training-job/t", "ready")
    ]
    # Rewards are posted before the completion, as the service expects.
    assert len(model.update_rewards) == 1 and len(model.complete_rollouts) == 1


@pytest.mark.parametrize("use_async", [True, False], ids=["async", "sync"])
def test_skipped_reports_nothing(use_async: bool, model: Any, payload: Any) -> None:
    response = invoke(
        rft_app(returning({"status": "skipped"}, use_async=use_async)), payload("r1", model.url)
    )
    assert (response.status_code, response.json()) == (200, {"status": "skipped"})
    assert model.update_rewards == [] and model.complete_rollouts == []


@pytest.mark.parametrize("use_async", [True, False], ids=["async", "sync"])
def test_an_exception_reports_failed_answers_500_and_the_app_keeps_serving(
    use_async: bool, model: Any, payload: Any
) -> None:
    calls = []

    def body(row: Any) -> float:
        calls.append(row)
        if row == "explode":
            raise RuntimeError("the tool server is down")
        return 1.0

    if use_async:

        async def rollout(row: Any, ctx: RolloutContext) -> float:
            return body(row)

    else:

        def rollout(row: Any, ctx: RolloutContext) -> float:
            return body(row)

    app = rft_app(rollout)
    failed = invoke(app, payload("r1", model.url, prompt="explode"))
    assert failed.status_code == 500
    assert failed.json() == {"error": "RuntimeError: the tool server is down"}
    assert model.reports("r1") == (
        [],
        [{"JobArn": model.complete_rollouts[0]["JobArn"], "TrajectoryId": "r1", "Status": "failed"}],
    )
    served = invoke(app, payload("r2", model.url, prompt="fine"))
    assert (served.status_code, served.json()["reward"]) == (200, 1.0)
    assert calls == ["explode", "fine"]


def test_a_rollout_may_declare_itself_failed(model: Any, payload: Any) -> None:
    returned = {"status": "error", "error": "the sandbox crashed"}
    response = invoke(rft_app(returning(returned, use_async=True)), payload("r1", model.url))
    assert (response.status_code, response.json()) == (500, {"error": "the sandbox crashed"})
    assert [c["Status"] for c in model.complete_rollouts] == ["failed"] and model.update_rewards == []


@pytest.mark.parametrize(
    ("returned", "named"),
    [
        (math.nan, "the returned reward is nan"),
        (math.inf, "the returned reward is inf"),
        ([1.0, -math.inf], "the returned reward[1] is -inf"),
        (None, "the returned reward must be a number, got NoneType"),
        ("1.0", "the returned reward must be a number, got str"),
        (True, "the returned reward must be a number, got bool"),
        ([], "the returned reward is an empty list"),
        ({"reward": math.nan}, "the returned 'reward' is nan"),
        ({"metrics": {"a": 1}}, "the returned dict has no 'reward'"),
        ({"reward": 1.0, "metrics": {"a": "x"}}, "metrics['a'] must be a number"),
        ({"reward": 1.0, "metrics": [1]}, "the returned 'metrics' must be a dict"),
        ({"status": "done", "reward": 1.0}, "the returned 'status' is 'done'"),
    ],
)
def test_a_result_that_is_no_reward_fails_the_rollout_with_400(
    returned: Any, named: str, model: Any, payload: Any
) -> None:
    response = invoke(rft_app(returning(returned, use_async=False)), payload("r1", model.url))
    assert response.status_code == 400
    assert named in response.json()["error"]
    assert model.update_rewards == [] and [c["Status"] for c in model.complete_rollouts] == ["failed"]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ([1, 2], "must be a JSON object with 'prompt' and 'metadata', got list"),
        ("text", "must be a JSON object with 'prompt' and 'metadata', got str"),
        ({"prompt": "x"}, "metadata: Field required"),
        ({"prompt": "x", "metadata": "job"}, "metadata: Input should be a valid dictionary"),
        ({"prompt": "x", "metadata": {"rolloutId": "r"}}, "metadata.jobArn: Field required"),
        ({"prompt": "x", "metadata": {"jobArn": "j"}}, "metadata.rolloutId: Field required"),
        ({"metadata": {"jobArn": "j", "rolloutId": "r"}}, "prompt: Field required"),
        (
            {"prompt": "x", "metadata": {"jobArn": "j\u0080", "rolloutId": "r"}},
            "metadata.jobArn: Value error, must be printable ASCII",
        ),
        (
            {"prompt": "x", "metadata": {"jobArn": "j", "rolloutId": "r\n"}},
            "metadata.rolloutId: Value error, must be printable ASCII",
        ),
        (
            {"prompt": "x", "metadata": {"jobArn": "j", "rolloutId": "r"}, "rftkit": {"api_key": "k\u00e9"}},
            "rftkit.api_key",
        ),
        (
            {"prompt": "x", "metadata": {"jobArn": "j", "rolloutId": "r", "endpoint": "ftp://x"}},
            "metadata.endpoint: Value error, endpoint must be an http:// or https:// URL",
        ),
        (
            {"prompt": "x", "metadata": {"jobArn": "j", "rolloutId": "r"}, "inferenceParams": {"topP": 2}},
            "inferenceParams.topP",
        ),
    ],
)
def test_a_payload_it_cannot_read_answers_400_naming_the_field(body: Any, named: str) -> None:
    ran = []
    app = rft_app(lambda row, ctx: ran.append(row) or 1.0)
    response = invoke(app, body)
    assert response.status_code == 400
    assert named in response.json()["error"]
    assert ran == []


def test_readable_metadata_gets_its_rejection_reported(model: Any, payload: Any) -> None:
    body = payload("r1", model.url, inferenceParams={"maxTokens": 0})
    response = invoke(rft_app(returning(1.0, use_async=True)), body)
    assert response.status_code == 400 and "inferenceParams.maxTokens" in response.json()["error"]
    assert [c["Status"] for c in model.complete_rollouts] == ["failed"]


def test_json_rows_are_parsed_when_declared(model: Any, payload: Any) -> None:
    seen = []

    @rft_handler(row_format="json")
    def rollout(row: Any, ctx: RolloutContext) -> float:
        seen.append(row)
        return 1.0

    app = BedrockAgentCoreApp()
    app.entrypoint(rollout)
    assert invoke(app, payload("r1", model.url, prompt='{"secret": "crane"}')).status_code == 200
    assert invoke(app, payload("r2", model.url, prompt={"secret": "slate"})).status_code == 200
    bad = invoke(app, payload("r3", model.url, prompt="{secret: crane}"))
    assert bad.status_code == 400
    assert bad.json()["error"].startswith("prompt is not valid JSON")
    assert seen == [{"secret": "crane"}, {"secret": "slate"}]
    assert model.reports("r3")[1][0]["Status"] == "failed"


def test_raw_rows_pass_through_untouched(payload: Any) -> None:
    seen = []
    app = rft_app(lambda row, ctx: seen.append(row) or 0.0)
    invoke(app, payload("r1", None, prompt='{"secret": "crane"}'))
    assert seen == ['{"secret": "crane"}']


def test_the_context_carries_the_payload(payload: Any) -> None:
    seen: list[RolloutContext] = []

    def rollout(row: Any, ctx: RolloutContext) -> float:
        seen.append(ctx)
        return 0.0

    body = payload(
        "r9",
        "http://127.0.0.1:9/v1/",
        inferenceParams={"maxTokens": 64, "topP": 0.9},
        rftkit={"model": "policy", "api_key": "k1"},
    )
    assert invoke(rft_app(rollout), body).status_code == 200
    (ctx,) = seen
    assert (ctx.job_arn, ctx.rollout_id, ctx.endpoint) == (
        "arn:aws:sagemaker:us-west-2:111122223333:training-job/t",
        "r9",
        "http://127.0.0.1:9",
    )
    assert ctx.model_id == "policy"
    assert ctx.openai_params() == {"max_tokens": 64, "top_p": 0.9}
    assert ctx.headers["Authorization"] == "Bearer k1"
    # The app passes its own request context through (the wrapper's second parameter is `context`).
    assert ctx.request_context is not None and ctx.request_context.session_id is None


def test_the_wrapper_signature_is_what_the_app_inspects() -> None:
    async def rollout(row: Any, ctx: RolloutContext) -> float:
        return 0.0

    wrapped = rft_handler(rollout)
    assert list(inspect.signature(wrapped).parameters) == ["payload", "context"]
    assert not hasattr(wrapped, "__wrapped__")
    assert inspect.iscoroutinefunction(wrapped)
    assert wrapped.__name__ == "rollout"
    assert not inspect.iscoroutinefunction(rft_handler(lambda row, ctx: 0.0))


def test_entrypoint_outside_rft_handler_is_caught_with_the_fix() -> None:
    app = BedrockAgentCoreApp()
    with pytest.raises(TypeError) as caught:

        @rft_handler
        @app.entrypoint
        async def rollout(row: Any, ctx: RolloutContext) -> float:
            return 0.0

    message = str(caught.value)
    assert "@rft_handler is placed outside @app.entrypoint on `rollout`" in message
    assert "@app.entrypoint\n    @rft_handler\n    async def rollout(row, ctx):" in message
    assert "app = rft_app(rollout)" in message


def test_the_wrong_order_is_caught_for_callables_that_refuse_the_run_attribute() -> None:
    class Agent:
        def rollout(self, row: Any, ctx: RolloutContext) -> float:
            return 0.0

    app = BedrockAgentCoreApp()
    bound = Agent().rollout
    registered = app.entrypoint(bound)
    assert not hasattr(registered, "run")  # a bound method refuses it: the other signal must catch this
    with pytest.raises(TypeError, match="placed outside @app.entrypoint"):
        rft_handler(registered)
    # The right order with the same kind of callable works.
    assert callable(rft_handler(Agent().rollout))


def test_the_right_order_and_rft_app_register_the_wrapper() -> None:
    app = BedrockAgentCoreApp()

    @app.entrypoint
    @rft_handler
    def rollout(row: Any, ctx: RolloutContext) -> float:
        return 0.0

    assert app.handlers["main"] is rollout and hasattr(rollout, "run")
    own = BedrockAgentCoreApp()
    assert rft_app(lambda row, ctx: 0.0, app=own) is own and "main" in own.handlers


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (lambda row: 0.0, "must accept two positional arguments `(row, ctx)`"),
        (42, "wraps a rollout function `(row, ctx)`, got int"),
        (BedrockAgentCoreApp(), "not a BedrockAgentCoreApp"),
        (rft_handler(lambda row, ctx: 0.0), "already wrapped by @rft_handler"),
    ],
)
def test_misuse_is_refused_at_decoration(target: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        rft_handler(target)


def test_a_row_format_typo_is_refused() -> None:
    with pytest.raises(ValueError, match="row_format must be 'raw' or 'json'"):
        rft_handler(row_format="JSON")  # type: ignore[arg-type]
