"""``rft serve``: run the policy server on its own, for developing an agent against a local model."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER
from policy_server.chat_templates import ChatTemplateError
from policy_server.engines.base import Engine
from policy_server.running import ServerThread
from policy_server.server import PolicyServer


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rft serve",
        description="Serve a model (and a LoRA adapter) through the OpenAI-compatible policy gateway.",
    )
    parser.add_argument("--model", required=True, type=Path, help="model directory (transformers format)")
    parser.add_argument(
        "--engine", choices=("hf", "vllm"), default="hf", help="inference engine (default: hf)"
    )
    parser.add_argument("--adapter", type=Path, help="peft LoRA adapter directory to serve as version 1")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=8000, help="port to bind; 0 picks a free one (default: 8000)"
    )
    parser.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every request")
    parser.add_argument("--policy-name", default="policy", help="model name clients request (or 'default')")
    parser.add_argument(
        "--open-job",
        metavar="ARN",
        help="open a job with this ARN that accepts any rollout id (for agent development)",
    )
    parser.add_argument("--max-tokens", type=int, default=1024, help="max_tokens cap of the --open-job job")
    parser.add_argument(
        "--max-calls-per-rollout", type=int, default=64, help="call cap per rollout of the --open-job job"
    )
    parser.add_argument(
        "--vllm-python", help="Python of vLLM's own environment (default: $RFTKIT_VLLM_PYTHON)"
    )
    parser.add_argument("--vllm-url", help="attach to a running vLLM server instead of starting one")
    parser.add_argument(
        "--chat-template",
        help="template replacing the model's own, for either engine: a shipped name (chatml-tools: "
        "ChatML with hermes tool calls) or a Jinja file",
    )
    parser.add_argument(
        "--tool-call-parser",
        default="hermes",
        help="vllm engine: vLLM's --tool-call-parser (hermes, llama3_json, openai, ...; 'none' for "
        "no parser; default: hermes)",
    )
    parser.add_argument(
        "--reasoning-parser", help="vllm engine: vLLM's --reasoning-parser (qwen3, openai_gptoss, ...)"
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="uvicorn log level; 'info' logs every request (default: info)",
    )
    return parser


def _engine(args: argparse.Namespace) -> Engine:
    # Imported here: each engine pulls in its own heavy stack (torch, or a vLLM process manager).
    if args.engine == "vllm":
        from policy_server.engines.vllm import VLLMEngine

        return VLLMEngine(
            args.model,
            python=args.vllm_python,
            base_url=args.vllm_url,
            served_name=args.policy_name,
            tool_call_parser=None if args.tool_call_parser == "none" else args.tool_call_parser,
            reasoning_parser=args.reasoning_parser,
            chat_template=args.chat_template,
        )
    from policy_server.engines.hf import HFEngine

    return HFEngine(args.model, chat_template=args.chat_template)


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
    if not (args.model / "config.json").is_file():
        print(f"rft serve: {args.model} is not a model directory (no config.json in it)")
        return 2
    if args.adapter is not None and not (args.adapter / "adapter_config.json").is_file():
        print(f"rft serve: {args.adapter} is not a peft adapter directory (no adapter_config.json in it)")
        return 2
    _stop_on_interrupt_or_term()
    try:
        engine = _engine(args)
    except ChatTemplateError as exc:
        print(f"rft serve: {exc}")
        return 2
    server = PolicyServer(engine, policy_name=args.policy_name, api_key=args.api_key)
    thread = ServerThread(server, host=args.host, port=args.port, log_level=args.log_level).start()
    try:
        if args.adapter is not None:
            version = thread.run(server.load_adapter(args.adapter))
            print(f"adapter {args.adapter} loaded as version {version}")
        print(f"OpenAI-compatible endpoint: {thread.url}/v1  (model: {args.policy_name!r} or 'default')")
        if args.open_job:
            server.open_job(
                args.open_job,
                max_tokens=args.max_tokens,
                max_calls_per_rollout=args.max_calls_per_rollout,
                auto_open_rollouts=True,
            )
            print(f"job {args.open_job!r} is open; send these headers on every call:")
            print(f"  {JOB_ARN_HEADER}: {args.open_job}")
            print(f"  {TRAJECTORY_ID_HEADER}: <any id per episode>")
        else:
            print(f"no job is open: calls answer 400 until one is opened (POST {thread.url}/admin/open-job)")
        if args.api_key:
            print("  Authorization: Bearer <your --api-key>")
        print("Ctrl-C stops the server.")
        threading.Event().wait()
    except KeyboardInterrupt:
        print("stopping")
    finally:
        thread.stop()
    return 0
