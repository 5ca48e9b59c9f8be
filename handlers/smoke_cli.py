"""``rft smoke TARGET [--payload FILE]``: the command around :mod:`handlers.smoke`'s checks.

Reads the payload (a file, ./payloads/smoke.json, or the built-in one), picks the check by the target's
form (an http(s) URL or an AgentCore runtime ARN), prints the report and exits with its code.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import re
import secrets
from pathlib import Path

import httpx
from pydantic import ValidationError

from handlers import smoke
from handlers.agent_client import is_runtime_arn
from handlers.protocol import RolloutPayload
from handlers.sagemaker_tokens import SageMakerTokenPolicy
from handlers.smoke import (
    BUILTIN_PAYLOAD,
    DEFAULT_PAYLOAD_PATH,
    DEFAULT_TIMEOUT_S,
    EXIT_CANNOT_RUN,
    NO_EPISODE_PLAYED,
    Outcome,
    SmokeReport,
    smoke_arn,
    smoke_url,
    with_endpoint,
)
from handlers.smoke_endpoint import Demand


class PayloadFileError(ValueError):
    """The smoke payload file is missing or is not a rollout payload."""


def load_payload(path: Path | None) -> tuple[RolloutPayload, str]:
    """The payload to send and where it came from: ``path``, ./payloads/smoke.json, or the built-in one."""
    if path is None:
        if not DEFAULT_PAYLOAD_PATH.is_file():
            return RolloutPayload.model_validate(BUILTIN_PAYLOAD), "the built-in smoke payload"
        path = DEFAULT_PAYLOAD_PATH
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise PayloadFileError(f"cannot read the payload file {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise PayloadFileError(f"the payload file {path} is not JSON: {exc}") from exc
    try:
        return RolloutPayload.model_validate(raw), str(path)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc']) or 'payload'}: {item['msg']}"
            for item in exc.errors()[:3]
        )
        raise PayloadFileError(f"the payload file {path} is not a rollout payload: {problems}") from exc


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rft smoke",
        description=(smoke.__doc__ or "").split("\n\n")[0].replace("\n", " "),
        epilog=(
            "exit codes: 0 healthy, 1 partial, 2 the check could not run, 3 agent error, "
            "4 access denied (or a credential a run would refuse), 5 not reachable"
        ),
    )
    parser.add_argument("target", help="agent URL (http://localhost:8080) or AgentCore runtime ARN")
    parser.add_argument(
        "--payload", type=Path, help="payload JSON file (default: ./payloads/smoke.json, else a built-in one)"
    )
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds to wait (default 60)"
    )
    parser.add_argument(
        "--api-key",
        help="the key the endpoint demands and the payload hands the agent, as policy_server.api_key "
        "(default: a fresh one, as a run draws one when policy_server.api_key is unset)",
    )
    parser.add_argument(
        "--no-api-key",
        action="store_true",
        help="demand no key, as a run with policy_server.api_key: none",
    )
    parser.add_argument(
        "--accept-sagemaker-tokens",
        action="store_true",
        help="also take the SageMaker SDK's bearer tokens, as policy_server.accept_sagemaker_tokens",
    )
    parser.add_argument(
        "--sagemaker-access-key-id",
        dest="sagemaker_access_key_ids",
        action="append",
        default=[],
        metavar="AKID",
        help="with --accept-sagemaker-tokens: an access key id tokens may name, as "
        "policy_server.sagemaker_access_key_ids; repeatable (default: any)",
    )
    parser.add_argument(
        "--model",
        type=Path,
        help="after the refusal check, play the payload's row for real against this model directory, "
        "served here as `rft serve --open-job` serves it, and print each episode (URL targets only)",
    )
    parser.add_argument(
        "--episodes", type=int, default=1, help="with --model: how many episodes to play (default 1)"
    )
    parser.add_argument("--chat-template", help="with --model: template replacing the model's own")
    parser.add_argument("--qualifier", help="AgentCore endpoint qualifier (ARN targets only)")
    parser.add_argument(
        "--endpoint",
        help="policy endpoint for the remote agent to call (ARN targets only)",
    )
    return parser


def _demand(args: argparse.Namespace) -> Demand:
    """The credential a run with these settings demands: its key (a fresh one unless named or none)."""
    api_key = None if args.no_api_key else (args.api_key or f"smoke-{secrets.token_urlsafe(16)}")
    tokens = None
    if args.accept_sagemaker_tokens:
        tokens = SageMakerTokenPolicy(access_key_ids=frozenset(args.sagemaker_access_key_ids))
    return Demand(api_key=api_key, sagemaker_tokens=tokens)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.model is not None and (is_runtime_arn(args.target) or args.episodes < 1):
        print("rft smoke: --model plays 1 or more --episodes against an agent URL (http://...)")
        return EXIT_CANNOT_RUN
    if args.sagemaker_access_key_ids and not args.accept_sagemaker_tokens:
        print(
            "rft smoke: --sagemaker-access-key-id narrows the SageMaker tokens smoke takes: add "
            "--accept-sagemaker-tokens, as a run needs policy_server.accept_sagemaker_tokens: true"
        )
        return EXIT_CANNOT_RUN
    demand = _demand(args)
    try:
        payload, source = load_payload(args.payload)
    except PayloadFileError as exc:
        print(f"rft smoke: {exc}")
        return EXIT_CANNOT_RUN
    print(f"sending {source} (job {payload.metadata.job_arn}, rollout {payload.metadata.rollout_id})")
    if is_runtime_arn(args.target):
        from botocore.exceptions import BotoCoreError

        if args.endpoint:
            payload = with_endpoint(payload, args.endpoint)
        elif payload.metadata.endpoint is None:
            print(
                "note: the payload names no metadata.endpoint, so the agent has no model to call (--endpoint)"
            )
        try:
            report = smoke_arn(args.target, payload, timeout=args.timeout, qualifier=args.qualifier)
        except BotoCoreError as exc:
            print(f"rft smoke: cannot call AgentCore: {exc}")
            return EXIT_CANNOT_RUN
    elif args.target.startswith(("http://", "https://")):
        try:
            httpx.URL(args.target)
        except httpx.InvalidURL as exc:
            print(f"rft smoke: {args.target!r} is not a valid URL: {exc}")
            return EXIT_CANNOT_RUN
        report = smoke_url(args.target, payload, timeout=args.timeout, demand=demand)
    else:
        print(f"rft smoke: TARGET must be an http(s) URL or an AgentCore runtime ARN, got {args.target!r}")
        return EXIT_CANNOT_RUN
    if args.payload is None:
        report = with_payload_hint(report, source)
    played_here = not is_runtime_arn(args.target)  # --model plays against URL targets only
    if args.model is None and played_here and report.outcome in (Outcome.HEALTHY, Outcome.PARTIAL):
        report.unverified.append(NO_EPISODE_PLAYED)
    print(report.render())
    if args.model is None:
        return report.exit_code
    if report.outcome not in (Outcome.HEALTHY, Outcome.PARTIAL):
        print("rft smoke: no episodes played: fix what the refusal check found first")
        return report.exit_code
    return _play(args, payload, demand) or report.exit_code


def _play(args: argparse.Namespace, payload: RolloutPayload, demand: Demand) -> int:
    """Play the episodes of --model; the model's side (torch, the policy server) is imported only
    here, as `rft`'s dispatcher imports a subcommand, so the agent side installs without it."""
    try:
        module = importlib.import_module("trainer.smoke_play")
    except ModuleNotFoundError as exc:
        print(
            f"rft smoke --model needs the training extras ({exc.name} is missing): "
            "pip install 'rftkit[train]'"
        )
        return EXIT_CANNOT_RUN
    try:
        return int(
            module.play(
                args.target,
                payload,
                args.model,
                episodes=args.episodes,
                timeout=args.timeout,
                api_key=demand.api_key,
                chat_template=args.chat_template,
                sagemaker_tokens=demand.sagemaker_tokens,
            )
        )
    except module.ModelDirError as exc:
        print(f"rft smoke: {exc}")
        return EXIT_CANNOT_RUN


# What an agent answers when the row it got lacks the fields it reads (a KeyError, or a string indexed
# by a field name).
_MISSING_FIELD = re.compile(r"\b(KeyError|TypeError: string indices)\b")


def with_payload_hint(report: SmokeReport, source: str) -> SmokeReport:
    """``report``, its verdict telling the user to pass their own row when the agent failed to read
    the row of a payload they did not choose."""
    if report.outcome is not Outcome.AGENT_ERROR or not any(map(_MISSING_FIELD.search, report.observations)):
        return report
    hint = (
        f"; rft smoke sent {source}, whose row your agent cannot read: pass a payload holding one of "
        "your rows in its prompt with --payload FILE (e.g. agents/template/payloads/smoke.json)"
    )
    return dataclasses.replace(report, verdict=report.verdict + hint)
