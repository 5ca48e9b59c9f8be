"""``@rft_handler`` and ``rft_app``: turn ``rollout(row, ctx) -> reward`` into an AgentCore entrypoint.

The wrapper parses the payload, builds a fresh :class:`~handlers.context.RolloutContext`, runs the
rollout, checks its result (:mod:`handlers.results`), reports it to the policy endpoint and answers
``/invocations``:

- 200 with a :class:`~handlers.protocol.RolloutResponse` for a played (or skipped) rollout;
- 400 ``{"error": ...}`` for a payload it cannot read (the rollout never starts) and for a result
  that is no reward (NaN, infinity, not a number: the agent's bug; the rollout is reported failed);
- 400 when the rollout raised :class:`~handlers.context.InvalidRowError` (a row it cannot play);
- 500 ``{"error": ...}`` when the rollout raised anything else or returned ``{"status": "failed"}`` (reported
  failed, never scored as zero); the app keeps serving.

A sync rollout function gets a sync wrapper, which the app runs in its thread pool. An async one gets
an async wrapper, which the app runs on its ONE shared worker event loop: an async rollout must never
block (no ``time.sleep``, no sync model client, ``await agent.invoke_async(...)`` not ``agent(...)``),
or it serialises every rollout on the app.
"""

from __future__ import annotations

import functools
import gc
import inspect
import json
import logging
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from bedrock_agentcore.runtime import BedrockAgentCoreApp
from pydantic import ValidationError
from starlette.responses import JSONResponse

from handlers.context import InvalidRowError, MissingEndpointError, RolloutContext
from handlers.limits import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_PAYLOAD_BYTES, PayloadLimits
from handlers.protocol import (
    ResultStatus,
    RftkitExtras,
    RolloutMetadata,
    RolloutPayload,
    RolloutResponse,
    RolloutStatus,
)
from handlers.reporting import report_rollout, report_rollout_async
from handlers.results import InvalidResultError, interpret_result

logger = logging.getLogger(__name__)

RowFormat = Literal["raw", "json"]
RolloutFunction = Callable[[Any, RolloutContext], Any]
# Set on every wrapper, pointing at the user's function. Deliberately not ``__wrapped__``: the app reads
# ``inspect.signature`` (which follows ``__wrapped__``) to decide whether to pass ``context``.
ROLLOUT_ATTRIBUTE = "__rft_rollout__"

_STACKING_HELP = """Put the entrypoint outermost:

    app = BedrockAgentCoreApp()

    @app.entrypoint
    @rft_handler
    {kind}def {name}(row, ctx):
        ...

or skip the stacking entirely:

    app = rft_app({name})"""


# --- decoration-time checks ------------------------------------------------------------------------


def _is_async(fn: Any) -> bool:
    # A callable object with `async def __call__` is async too (the app checks the same way).
    return inspect.iscoroutinefunction(fn) or (callable(fn) and inspect.iscoroutinefunction(fn.__call__))


def _cell_holds_app(cell: types.CellType) -> bool:
    try:
        return isinstance(cell.cell_contents, BedrockAgentCoreApp)
    except ValueError:  # an empty cell
        return False


def _registered_by_an_app(fn: Callable[..., Any]) -> bool:
    """True when ``@app.entrypoint`` has already registered ``fn`` (the decorator-order mistake)."""
    run = getattr(fn, "run", None)
    closure = getattr(run, "__closure__", None) or ()
    if any(_cell_holds_app(cell) for cell in closure):
        return True
    if isinstance(fn, types.FunctionType):
        # app.entrypoint always manages to set `.run` on a plain function, so the check above is complete.
        return False
    # Bound methods and other callables may refuse the `.run` attribute: look for an app holding fn.
    for holder in gc.get_referrers(fn):
        if isinstance(holder, dict) and holder.get("main") is fn:
            for owner in gc.get_referrers(holder):
                if isinstance(owner, BedrockAgentCoreApp) and owner.handlers is holder:
                    return True
                if isinstance(owner, dict) and owner.get("handlers") is holder:
                    return True
    return False


def _check_rollout_function(fn: Any) -> None:
    name = getattr(fn, "__name__", "rollout")
    kind = "async " if _is_async(fn) else ""
    if isinstance(fn, BedrockAgentCoreApp):
        raise TypeError("@rft_handler wraps a rollout function `(row, ctx)`, not a BedrockAgentCoreApp")
    if not callable(fn):
        raise TypeError(f"@rft_handler wraps a rollout function `(row, ctx)`, got {type(fn).__name__}")
    if hasattr(fn, ROLLOUT_ATTRIBUTE):
        raise TypeError(f"`{name}` is already wrapped by @rft_handler; apply it once")
    if _registered_by_an_app(fn):
        raise TypeError(
            f"@rft_handler is placed outside @app.entrypoint on `{name}`: the app registered your "
            "function itself, so it would be called without its payload parsed and every rollout "
            "would fail or hang until the trainer times out.\n" + _STACKING_HELP.format(name=name, kind=kind)
        )
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise TypeError(f"`{name}` is a generator: a rollout function returns its reward, it does not yield")
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        raise TypeError(
            f"`{name}` must accept two positional arguments `(row, ctx)`: the dataset row and the "
            "RolloutContext"
        ) from None
    except ValueError:
        return  # callables without an inspectable signature (some builtins) are taken on trust


# --- request-time parsing, result checking, reporting ----------------------------------------------


@dataclass(frozen=True)
class _Report:
    """The feedback posts owed to the policy endpoint once a rollout has an outcome."""

    endpoint: str
    job_arn: str
    rollout_id: str
    status: RolloutStatus
    rewards: list[float] | None = None
    api_key: str | None = None

    def post(self) -> None:
        report_rollout(
            self.endpoint, self.job_arn, self.rollout_id, self.status, self.rewards, api_key=self.api_key
        )

    async def post_async(self) -> None:
        await report_rollout_async(
            self.endpoint, self.job_arn, self.rollout_id, self.status, self.rewards, api_key=self.api_key
        )


# What a wrapper owes once a rollout is over: the report (None when there is nowhere or nothing to
# report) and the answer to /invocations.
_Outcome = tuple[_Report | None, dict[str, Any] | JSONResponse]


def _error(message: str, status_code: int) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status_code)


def _failed_report(metadata: RolloutMetadata | None, api_key: str | None) -> _Report | None:
    if metadata is None or metadata.endpoint is None:
        return None
    return _Report(
        metadata.endpoint, metadata.job_arn, metadata.rollout_id, RolloutStatus.FAILED, None, api_key
    )


def _describe(error: ValidationError) -> str:
    problems = []
    for item in error.errors()[:3]:
        where = ".".join(str(part) for part in item["loc"]) or "payload"
        problems.append(f"{where}: {item['msg']}")
    more = f" (and {error.error_count() - 3} more)" if error.error_count() > 3 else ""
    return "invalid rollout payload: " + "; ".join(problems) + more


def _rejected(raw: dict[str, Any], error: ValidationError) -> _Outcome:
    """A payload that failed validation; its failure is still reported when its metadata is readable."""
    try:
        metadata = RolloutMetadata.model_validate(raw.get("metadata"))
    except ValidationError:
        return None, _error(_describe(error), 400)
    try:
        api_key = RftkitExtras.model_validate(raw.get("rftkit") or {}).api_key
    except ValidationError:
        api_key = None
    return _failed_report(metadata, api_key), _error(_describe(error), 400)


def _begin(payload: Any, request_context: Any, row_format: RowFormat) -> RolloutContext | _Outcome:
    """Parse the payload into a fresh context, or answer 400 naming the field at fault."""
    if not isinstance(payload, dict):
        message = (
            "the rollout payload must be a JSON object with 'prompt' and 'metadata', "
            f"got {type(payload).__name__}"
        )
        return None, _error(message, 400)
    try:
        parsed = RolloutPayload.model_validate(payload)
    except ValidationError as exc:
        return _rejected(payload, exc)
    api_key = parsed.rftkit.api_key if parsed.rftkit is not None else None
    row = parsed.prompt
    if row_format == "json" and row is None:
        message = "prompt is missing: this agent expects its row as JSON"
        return _failed_report(parsed.metadata, api_key), _error(message, 400)
    if row_format == "json" and isinstance(row, str):
        try:
            row = json.loads(row)
        except json.JSONDecodeError as exc:
            message = (
                f"prompt is not valid JSON ({exc.msg} at position {exc.pos}): this agent declared "
                "row_format='json', so send the row as a JSON object or a JSON string"
            )
            return _failed_report(parsed.metadata, api_key), _error(message, 400)
    return RolloutContext(parsed, row, request_context)


def _finish(
    ctx: RolloutContext, name: str, returned: Any = None, raised: Exception | None = None
) -> _Outcome:
    """Turn what the rollout function returned (or raised) into its report and its answer."""
    failed = _failed_report(ctx.payload.metadata, ctx.api_key)
    if isinstance(raised, InvalidRowError):
        logger.warning("rollout function %s refused its row: %s", name, raised)
        return failed, _error(f"invalid row: {raised}", 400)
    if isinstance(raised, MissingEndpointError):  # the payload's fault, not the agent's
        return failed, _error(f"invalid rollout payload: {raised}", 400)
    if raised is not None:
        logger.error("rollout function %s raised", name, exc_info=raised)
        return failed, _error(f"{type(raised).__name__}: {raised}", 500)
    try:
        result = interpret_result(returned)
    except InvalidResultError as exc:
        logger.error("rollout function %s returned no valid reward: %s", name, exc)
        return failed, _error(str(exc), 400)
    if result.status == ResultStatus.FAILED:
        return failed, _error(result.error or "the rollout reported itself failed", 500)
    if result.status == ResultStatus.SKIPPED:
        return None, {"status": ResultStatus.SKIPPED.value}
    answer = RolloutResponse(
        status=result.status, reward=result.reward, rewards=result.rewards, metrics=result.metrics
    ).model_dump(mode="json", exclude_none=True)
    if ctx.endpoint is None:
        return None, {**answer, **result.extras}
    report = _Report(
        ctx.endpoint, ctx.job_arn, ctx.rollout_id, RolloutStatus.READY, result.rewards, ctx.api_key
    )
    return report, {**answer, **result.extras}


# --- the wrappers ----------------------------------------------------------------------------------


def _copy_identity(wrapper: Callable[..., Any], fn: Callable[..., Any]) -> None:
    # Not functools.update_wrapper: it always sets __wrapped__, and the app would then read fn's signature.
    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        if hasattr(fn, name):
            setattr(wrapper, name, getattr(fn, name))
    setattr(wrapper, ROLLOUT_ATTRIBUTE, fn)


def _wrap_sync(fn: RolloutFunction, row_format: RowFormat) -> Callable[..., Any]:
    name = getattr(fn, "__name__", "rollout")

    def wrapper(payload: Any, context: Any = None) -> Any:
        started = _begin(payload, context, row_format)
        if isinstance(started, RolloutContext):
            try:
                outcome = _finish(started, name, returned=fn(started.row, started))
            except Exception as exc:  # reported and answered 500; the app keeps serving
                outcome = _finish(started, name, raised=exc)
        else:
            outcome = started
        report, answer = outcome
        if report is not None:
            report.post()
        return answer

    _copy_identity(wrapper, fn)
    return wrapper


def _wrap_async(fn: RolloutFunction, row_format: RowFormat) -> Callable[..., Any]:
    name = getattr(fn, "__name__", "rollout")

    async def wrapper(payload: Any, context: Any = None) -> Any:
        started = _begin(payload, context, row_format)
        if isinstance(started, RolloutContext):
            try:
                outcome = _finish(started, name, returned=await fn(started.row, started))
            except Exception as exc:  # reported and answered 500; the app keeps serving
                outcome = _finish(started, name, raised=exc)
        else:
            outcome = started
        report, answer = outcome
        if report is not None:
            await report.post_async()
        return answer

    _copy_identity(wrapper, fn)
    return wrapper


# --- public API ------------------------------------------------------------------------------------


def rft_handler(fn: RolloutFunction | None = None, *, row_format: RowFormat = "raw") -> Callable[..., Any]:
    """Wrap ``rollout(row, ctx)`` as an AgentCore entrypoint; use bare or as ``@rft_handler(row_format=...)``.

    ``row_format="json"`` parses a string ``prompt`` as JSON before it reaches ``row`` (a prompt that
    is not JSON answers 400). Must sit INSIDE ``@app.entrypoint`` (entrypoint outermost); the wrong
    order raises ``TypeError`` here. ``rft_app`` needs no stacking at all.

    An ``async def`` rollout runs on the app's one shared event loop and must never block; a plain
    ``def`` rollout runs in the app's thread pool.
    """
    if row_format not in ("raw", "json"):
        raise ValueError(f"row_format must be 'raw' or 'json', got {row_format!r}")
    if fn is None:
        return functools.partial(rft_handler, row_format=row_format)
    _check_rollout_function(fn)
    if _is_async(fn):
        return _wrap_async(fn, row_format)
    return _wrap_sync(fn, row_format)


def rft_app(
    fn: RolloutFunction,
    *,
    row_format: RowFormat = "raw",
    app: BedrockAgentCoreApp | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
) -> BedrockAgentCoreApp:
    """A ``BedrockAgentCoreApp`` (``app`` or a new one) serving ``fn`` as its rollout entrypoint.

    Payloads over ``max_payload_bytes`` answer 413, payloads not all sent within ``body_timeout_s``
    408, and JSON nested past what Python parses 400, all before the app reads them.
    """
    app = app if app is not None else BedrockAgentCoreApp()
    app.entrypoint(rft_handler(fn, row_format=row_format))
    app.add_middleware(PayloadLimits, max_bytes=max_payload_bytes, body_timeout_s=body_timeout_s)
    return app
