"""``rft collect CONFIG --teacher MODEL_DIR --out demos.jsonl [--min-reward X] [--episodes N]``: a
teacher plays the config's agents over its training rows; the episodes at or above the reward become
``rft sft`` demonstrations (docs/distillation.md)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from trainer.config import ConfigError, TrainConfig, load_config
from trainer.ops import pin_cpu_kernels


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rft collect",
        description="Play the config's agents over its train_file rows with a teacher model as the "
        "policy (served by rftkit's gateway, as `rft train` serves the policy) and write the episodes "
        "at or above a reward as `rft sft --data` demonstrations: every call of each episode, "
        "multi-turn.",
    )
    parser.add_argument("config", help="the training config (YAML or TOML) whose rows and agents to use")
    parser.add_argument(
        "--teacher",
        required=True,
        help="the teacher: a local model directory (transformers format), or the base URL of an "
        "OpenAI-compatible endpoint (https://host/v1) with --teacher-model and --teacher-key",
    )
    parser.add_argument("--teacher-model", help="with an endpoint: the model name it serves")
    parser.add_argument("--teacher-key", help="with an endpoint: its API key (sent as a bearer token)")
    parser.add_argument("--teacher-adapter", type=Path, help="a peft LoRA adapter served on the teacher")
    parser.add_argument("--out", required=True, type=Path, help="the demonstrations' JSONL file")
    parser.add_argument("--min-reward", type=float, default=1.0, help="keep episodes at or above (default 1)")
    parser.add_argument("--episodes", type=int, help="episodes to play (default: one per row)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a field"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log to stderr")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    endpoint = args.teacher.startswith(("http://", "https://"))
    if endpoint and (args.teacher_model is None or args.teacher_adapter is not None):
        print(
            f"rft collect: --teacher {args.teacher} is an endpoint: name the model it serves with "
            "--teacher-model (its /v1/models lists them); an endpoint takes no --teacher-adapter",
            file=sys.stderr,
        )
        return 2
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as error:
        print(f"rft collect: {error}", file=sys.stderr)
        return 2
    if args.episodes is not None and args.episodes < 1:
        print(f"rft collect: --episodes {args.episodes}: give 1 or more", file=sys.stderr)
        return 2
    if config.placement.cpu_kernels == "avx2":
        pin_cpu_kernels()  # as `rft train` does: the same numbers
    return _collect(config, args)


def _collect(config: TrainConfig, args: argparse.Namespace) -> int:
    from policy_server.engines import ForwardEngine
    from policy_server.models import LocalModelError, load_tokenizer, local_model_dir
    from trainer.distill.collect import demonstrations_of, endpoint_session, play_rows, teacher_session
    from trainer.errors import TrainingError
    from trainer.scale.placement import PlacementError
    from trainer.scale.plan import PlanError

    try:
        if args.teacher.startswith(("http://", "https://")):
            teacher = None
            session = endpoint_session(config, args.teacher, args.teacher_model, args.teacher_key)
        else:
            teacher = local_model_dir(args.teacher)
            session = teacher_session(config, teacher, args.teacher_adapter)
    except (LocalModelError, TrainingError, PlanError, PlacementError) as error:
        print(f"rft collect: {error}", file=sys.stderr)
        return 2
    try:
        played = play_rows(session, config, args.episodes)
    except TrainingError as error:
        print(f"rft collect: {error}", file=sys.stderr)
        return 1
    finally:
        session.close()
    tokenizer = load_tokenizer(teacher, config.chat_template) if teacher is not None else None

    def decode(ids: list[int], special: bool) -> str:
        return "" if tokenizer is None else str(tokenizer.decode(ids, skip_special_tokens=not special))

    lines, summary = demonstrations_of(played, args.min_reward, decode)
    engine = session.server.engine
    if isinstance(engine, ForwardEngine):  # the endpoint's own count: a forwarded call records no ids
        summary.prompt_tokens, summary.completion_tokens = engine.prompt_tokens, engine.completion_tokens
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(summary.describe(args.out, args.min_reward))
    if not lines:
        print("rft collect: no demonstrations: lower --min-reward or play more --episodes", file=sys.stderr)
        return 1
    return 0
