"""``rft serve``: run the policy server on its own, for developing an agent against a local model."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from handlers import (
    JOB_ARN_HEADER,
    TRAJECTORY_ID_HEADER,
    SageMakerTokenPolicy,
    ServingThread,
    exposure_refusal,
    is_loopback,
)
from policy_server.engines.base import Engine
from policy_server.http.images import (
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_IMAGES_PER_CALL,
    ImageLimits,
)
from policy_server.http.metrics import start_metrics_server
from policy_server.models.chat_templates import ChatTemplateError
from policy_server.models.families import AUTO, UnknownFamilyError, parsing_family, resolve_parsers
from policy_server.server import PolicyServer
from policy_server.workers.gateway_pool import serve_gateway


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rft serve",
        description="Serve a model (and a LoRA adapter) through the OpenAI-compatible policy gateway.",
    )
    _model_arguments(parser)
    _network_arguments(parser)
    _job_arguments(parser)
    return parser


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    """Options for the model and the engine that serves it."""
    parser.add_argument("--model", required=True, type=Path, help="model directory (transformers format)")
    parser.add_argument(
        "--engine", choices=("hf", "vllm"), default="hf", help="inference engine (default: hf)"
    )
    parser.add_argument("--adapter", type=Path, help="peft LoRA adapter directory to serve as version 1")
    parser.add_argument("--policy-name", default="policy", help="model name clients request (or 'default')")
    parser.add_argument(
        "--vllm-python", help="Python of vLLM's own environment (default: $RFTKIT_VLLM_PYTHON)"
    )
    parser.add_argument("--vllm-url", help="attach to a running vLLM server instead of starting one")
    parser.add_argument(
        "--device",
        default="auto",
        help="hf engine's device: auto (cuda:0 when present, else cpu), cpu, cuda:N",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="the model's dtype: hf engine, auto is bfloat16 on CUDA and float32 on CPU; vllm engine, "
        "vLLM's --dtype (its auto runs a float32 checkpoint in 16 bits)",
    )
    parser.add_argument(
        "--chat-template",
        help="template replacing the model's own, for either engine: a shipped name (chatml-tools: "
        "ChatML with hermes tool calls) or a Jinja file",
    )
    parser.add_argument(
        "--tool-call-parser",
        default=AUTO,
        help="vLLM's --tool-call-parser (hermes, llama3_json, openai, ...; 'none' for no parser); "
        "default auto: the model family's; the hf engine parses as the family using that parser",
    )
    parser.add_argument(
        "--reasoning-parser",
        default=AUTO,
        help="vLLM's --reasoning-parser (qwen3, openai_gptoss, ...; 'none' for no parser); default "
        "auto: the model family's",
    )


def _network_arguments(parser: argparse.ArgumentParser) -> None:
    """Options for where it listens and who may call it."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=8000, help="port to bind; 0 picks a free one (default: 8000)"
    )
    parser.add_argument(
        "--gateway-workers",
        type=int,
        default=1,
        help="gateway processes sharing the port (vllm engine only); 1: this process (default: 1)",
    )
    parser.add_argument(
        "--api-key", help="require 'Authorization: Bearer KEY' on the agents' routes (/v1, feedback, /health)"
    )
    parser.add_argument(
        "--allow-unauthenticated-network",
        action="store_true",
        help="serve a non-loopback --host without --api-key or --accept-sagemaker-tokens (refused "
        "otherwise: anyone who reaches it could use the model)",
    )
    parser.add_argument(
        "--admin-key",
        help="serve /admin/* (open jobs, take traces, load adapters) to 'Authorization: Bearer KEY'; "
        "unset: /admin/* is not served over HTTP. Never give it to agents",
    )
    parser.add_argument(
        "--adapters-dir",
        type=Path,
        help="the only directory /admin/load-adapter loads adapters from (default: none)",
    )
    parser.add_argument(
        "--accept-sagemaker-tokens",
        action="store_true",
        help="also accept the bearer tokens AWS's SageMaker SDK signs "
        "(checked offline; see docs/sagemaker.md)",
    )
    parser.add_argument(
        "--sagemaker-access-key-id",
        dest="sagemaker_access_key_ids",
        action="append",
        default=[],
        metavar="AKID",
        help="with --accept-sagemaker-tokens: an access key id tokens may name; repeatable (default: any)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus metrics at http://HOST:PORT/metrics, a port of their own that agents "
        "need not reach (0 picks a free one; default: no metrics port)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="uvicorn log level; 'info' logs every request (default: info)",
    )


def _job_arguments(parser: argparse.ArgumentParser) -> None:
    """Options for a job open for agent development, and what calls may carry."""
    parser.add_argument(
        "--open-job",
        metavar="ARN",
        help="open a job with this ARN that accepts any rollout id (for agent development)",
    )
    parser.add_argument(
        "--inference",
        action="store_true",
        help="a plain OpenAI-compatible inference server: calls need no job headers and nothing of "
        "them is kept (no traces, no rollout caps); --max-tokens caps each call",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=1024,
        help="max_tokens cap of the --open-job job or of --inference calls",
    )
    parser.add_argument(
        "--max-calls-per-rollout", type=int, default=64, help="call cap per rollout of the --open-job job"
    )
    parser.add_argument(
        "--max-open-rollouts",
        type=int,
        default=1024,
        help="rollouts the --open-job job holds at once; more answer 429 (default: 1024)",
    )
    parser.add_argument(
        "--max-image-bytes",
        type=int,
        default=DEFAULT_MAX_IMAGE_BYTES,
        help=f"largest image an agent may send, in bytes (default {DEFAULT_MAX_IMAGE_BYTES})",
    )
    parser.add_argument(
        "--max-images-per-call",
        type=int,
        default=DEFAULT_MAX_IMAGES_PER_CALL,
        help=f"most images in one call's conversation (default {DEFAULT_MAX_IMAGES_PER_CALL})",
    )
    parser.add_argument(
        "--max-image-pixels",
        type=int,
        default=DEFAULT_MAX_IMAGE_PIXELS,
        help=f"most pixels (width x height) per image (default {DEFAULT_MAX_IMAGE_PIXELS})",
    )


def _image_limits(args: argparse.Namespace) -> ImageLimits:
    return ImageLimits(args.max_image_bytes, args.max_images_per_call, args.max_image_pixels)


def _engine(args: argparse.Namespace) -> Engine:
    # Imported here: torch, and each engine's own stack (transformers, or a vLLM process manager).
    import torch

    settings = (args.tool_call_parser, args.reasoning_parser)
    parsers = resolve_parsers(args.model, *(None if name == "none" else name for name in settings))
    if args.engine == "vllm":
        from policy_server.engines.vllm import VLLMEngine

        return VLLMEngine(
            args.model,
            python=args.vllm_python,
            base_url=args.vllm_url,
            served_name=args.policy_name,
            tool_call_parser=parsers.tool_call,
            reasoning_parser=parsers.reasoning,
            chat_template=args.chat_template,
            dtype=args.dtype,
            image_limits=_image_limits(args),
            cpu_build=not torch.cuda.is_available(),
        )

    from policy_server.engines.hf import HFEngine

    device = args.device if args.device != "auto" else "cuda:0" if torch.cuda.is_available() else "cpu"
    dtype = args.dtype if args.dtype != "auto" else "bfloat16" if device.startswith("cuda") else "float32"
    parsing_family(parsers)  # refuses here, before the model loads, a parser it cannot mirror
    return HFEngine(
        args.model,
        device=device,
        dtype=getattr(torch, dtype),
        chat_template=args.chat_template,
        tool_call_parser=parsers.tool_call,
        reasoning_parser=parsers.reasoning,
    )


def _stop_on_interrupt_or_term() -> None:
    """Ctrl-C (SIGINT) and SIGTERM both stop the server.

    Python leaves SIGINT ignored when its parent started it so (a background job of a
    non-interactive shell, some CI runners): the server would then ignore Ctrl-C for good.
    """

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, interrupt)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    refusal = _refusal(args)
    if refusal is not None:
        print(f"rft serve: {refusal}")
        return 2
    _stop_on_interrupt_or_term()
    tokens = None
    if args.accept_sagemaker_tokens:
        tokens = SageMakerTokenPolicy(access_key_ids=frozenset(args.sagemaker_access_key_ids))
    try:
        engine = _engine(args)
    except (ChatTemplateError, UnknownFamilyError) as exc:
        print(f"rft serve: {exc}")
        return 2
    server = PolicyServer(
        engine,
        policy_name=args.policy_name,
        api_key=args.api_key,
        admin_key=args.admin_key,
        adapters_dir=args.adapters_dir,
        sagemaker_tokens=tokens,
        image_limits=_image_limits(args),
        inference_max_tokens=args.max_tokens if args.inference else None,
        allow_unauthenticated_network=args.allow_unauthenticated_network,
    )
    try:
        thread = serve_gateway(
            server, args.host, args.port, workers=args.gateway_workers, log_level=args.log_level
        ).start()
    except RuntimeError as error:  # the engine refused to start (an attached vLLM without LoRA, ...)
        print(f"rft serve: {error}")
        return 2
    metrics = None
    if args.metrics_port is not None:
        metrics = start_metrics_server(server.metrics, args.host, args.metrics_port)
    try:
        if args.adapter is not None:
            version = thread.run(server.load_adapter(args.adapter))
            print(f"adapter {args.adapter} loaded as version {version}")
        _announce(args, server, thread.url, tokens is not None, metrics)
        print("Ctrl-C stops the server.")
        threading.Event().wait()
    except KeyboardInterrupt:
        print("stopping")
    finally:
        if metrics is not None:
            metrics.stop()
        thread.stop()
    return 0


def _refusal(args: argparse.Namespace) -> str | None:
    """Why these options cannot be served, or None."""
    if not (args.model / "config.json").is_file():
        return f"{args.model} is not a model directory (no config.json in it)"
    if args.adapter is not None and not (args.adapter / "adapter_config.json").is_file():
        return f"{args.adapter} is not a peft adapter directory (no adapter_config.json in it)"
    if args.admin_key and args.admin_key == args.api_key:
        return "--admin-key must differ from --api-key (agents hold the API key)"
    exposed = exposure_refusal(args.host, args.api_key, args.accept_sagemaker_tokens)
    if exposed is not None and not args.allow_unauthenticated_network:
        return exposed
    if min(args.max_image_bytes, args.max_images_per_call, args.max_image_pixels) < 1:
        return "--max-image-bytes, --max-images-per-call and --max-image-pixels must be 1 or more"
    if args.gateway_workers < 1 or (args.gateway_workers > 1 and args.engine != "vllm"):
        return "--gateway-workers is at least 1, and more than 1 needs --engine vllm"
    if args.inference and (args.open_job or args.gateway_workers > 1):
        return (
            "--inference serves calls without jobs, in this process: drop --open-job and "
            "--gateway-workers (for more throughput, serve an export with vLLM itself: docs/serving.md)"
        )
    return None


def _announce(
    args: argparse.Namespace,
    server: PolicyServer,
    url: str,
    sagemaker_tokens: bool,
    metrics: ServingThread | None,
) -> None:
    """Open the development job, if asked, and print what a client needs to call the server."""
    print(f"OpenAI-compatible endpoint: {url}/v1  (model: {args.policy_name!r} or 'default')")
    if args.inference:
        print(
            "inference server: calls need no job headers and nothing of them is kept "
            f"(max_tokens {args.max_tokens} at most)"
        )
    elif args.open_job:
        server.open_job(
            args.open_job,
            max_tokens=args.max_tokens,
            max_calls_per_rollout=args.max_calls_per_rollout,
            auto_open_rollouts=True,
            max_open_rollouts=args.max_open_rollouts,
        )
        print(f"job {args.open_job!r} is open; send these headers on every call:")
        print(f"  {JOB_ARN_HEADER}: {args.open_job}")
        print(f"  {TRAJECTORY_ID_HEADER}: <any id per episode>")
    elif args.admin_key:
        print(f"no job is open: calls answer 400 until one is opened (POST {url}/admin/open-job)")
    else:
        print("no job is open: calls answer 400 (pass --open-job ARN, or --admin-key to open jobs)")
    if args.api_key:
        print("  Authorization: Bearer <your --api-key>")
    if sagemaker_tokens:
        print("  (or the SageMaker SDK's 'Authorization: Bearer sagemaker-api-key-...')")
    if not args.api_key and not sagemaker_tokens:
        who = "any process on this machine" if is_loopback(args.host) else f"anyone who reaches {args.host}"
        print(f"no API key: {who} may call the model (--api-key KEY makes callers send one)")
    if metrics is not None:
        print(f"Prometheus metrics: {metrics.url}/metrics")
