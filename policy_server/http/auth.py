"""``AuthMiddleware``: the gateway's two credentials and the two surfaces they open."""

from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from handlers import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER, SageMakerTokenPolicy, agent_refusal
from policy_server.http.responses import error_response

ADMIN_PREFIX = "/admin/"

ADMIN_NOT_SERVED = (
    "Admin operations are not served over HTTP by this server: the trainer runs them in process. "
    "Start `rft serve` with --admin-key to serve them to the holder of that key."
)


_JOB_ARN = JOB_ARN_HEADER.lower().encode()
_TRAJECTORY_ID = TRAJECTORY_ID_HEADER.lower().encode()

# Counts a refused call against the job and rollout its headers name, where those exist (it opens and
# changes nothing else): ``JobRegistry.reject_call``.
RefusalSink = Callable[[str | None, str | None, int, str], None]


def _bearer(scope: Scope) -> bytes:
    return dict(scope["headers"]).get(b"authorization", b"")


def _named_rollout(scope: Scope) -> tuple[str | None, str | None]:
    headers = dict(scope["headers"])
    job_arn, rollout_id = headers.get(_JOB_ARN), headers.get(_TRAJECTORY_ID)
    return (
        job_arn.decode("latin-1") if job_arn else None,
        rollout_id.decode("latin-1") if rollout_id else None,
    )


def _matches(given: bytes, key: str | None) -> bool:
    return key is not None and hmac.compare_digest(given, f"Bearer {key}".encode())


class AuthMiddleware:
    """Two credentials, two surfaces: the agents' key opens ``/v1/*``, the feedback routes and
    ``/health``; only the admin key opens ``/admin/*``, and without one ``/admin/*`` is not served.

    An agent holds whatever the trainer hands it, so its key must never reach the trainer's
    operations (close a job, take a trace, load an adapter).
    """

    def __init__(
        self,
        app: ASGIApp,
        api_key: str | None,
        admin_key: str | None,
        sagemaker_tokens: SageMakerTokenPolicy | None = None,
        on_refusal: RefusalSink | None = None,
    ) -> None:
        self.app = app
        self.on_refusal = on_refusal
        self.api_key = api_key
        self.admin_key = admin_key
        self.sagemaker_tokens = sagemaker_tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope["path"], _bearer(scope))
            if refusal is not None:
                if self.on_refusal is not None and not scope["path"].startswith(ADMIN_PREFIX):
                    # The rollout its headers name learns why its calls failed (the trainer fails it).
                    self.on_refusal(*_named_rollout(scope), *refusal)
                await error_response(scope["path"], *refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, path: str, given: bytes) -> tuple[int, str] | None:
        if path.startswith(ADMIN_PREFIX) or path == ADMIN_PREFIX.rstrip("/"):
            if self.admin_key is None:
                return 403, ADMIN_NOT_SERVED
            if _matches(given, self.admin_key):
                return None
            if _matches(given, self.api_key):
                return 403, "This is the agents' key: admin operations need the admin key."
            return 401, "Missing or wrong admin key: send the header 'Authorization: Bearer <admin key>'."
        refusal = agent_refusal(given.decode("latin-1"), self.api_key, self.sagemaker_tokens)
        return None if refusal is None else (401, refusal)
