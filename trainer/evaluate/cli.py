"""``rft eval CONFIG [--adapter DIR ...] [--base] [--samples K] [--out DIR]``: the base model and adapters
on the config's evaluation rows through its agents, with no training (docs/operations.md)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from trainer.config import ConfigError, load_config
from trainer.ops import pin_cpu_kernels


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rft eval",
        description="Evaluate the base model and adapters on the config's eval_file through its agents, "
        "with the seeds of `rft train`'s evaluations: success rate and mean reward with 95% intervals "
        "over rows, each adapter's difference from the base paired by row, tokens and cost. Writes "
        "eval.json, eval.md and eval.png.",
    )
    parser.add_argument("config", help="the training config (YAML or TOML) whose eval_file and agents to use")
    parser.add_argument(
        "--adapter",
        dest="adapters",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="a peft adapter directory (e.g. RUN/adapters/v3); repeat for several",
    )
    parser.add_argument(
        "--base", action="store_true", help="evaluate the base model too (the default without --adapter)"
    )
    parser.add_argument(
        "--samples", type=int, help="rollouts per row (default: the config's eval_generations)"
    )
    parser.add_argument("--out", type=Path, help="output directory (default: OUTPUT_DIR/eval of the config)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set eval_temperature=1.0; repeatable",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log to stderr")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as error:
        print(f"rft eval: {error}", file=sys.stderr)
        return 2
    if args.samples is not None and args.samples < 1:
        print(f"rft eval: --samples {args.samples}: give 1 or more rollouts per row", file=sys.stderr)
        return 2
    if config.placement.cpu_kernels == "avx2":
        pin_cpu_kernels()  # before the first tensor operation, as `rft train` does: the same numbers
    from trainer.errors import TrainingError
    from trainer.evaluate.policies import EvalError, check_adapters, eval_rows_of, evaluate_policies
    from trainer.evaluate.report import PLOT_FILE, REPORT_FILE, build_report, write_report
    from trainer.scale.placement import PlacementError
    from trainer.scale.plan import PlanError

    adapters = [adapter.resolve() for adapter in args.adapters]
    samples = args.samples or config.eval_generations
    out = (args.out or config.output_dir / "eval").resolve()
    try:
        rows = eval_rows_of(config, args.config)
        check_adapters(adapters)
    except (EvalError, TrainingError) as error:
        print(f"rft eval: {error}", file=sys.stderr)
        return 2
    if samples > 1 and config.eval_temperature == 0:
        print(
            f"rft eval: eval_temperature is 0 (greedy), so the {samples} samples of a row play the same "
            "episode unless the agent varies it; --set eval_temperature=1.0 samples them"
        )
    try:
        policies = evaluate_policies(
            config, rows, base=args.base or not adapters, adapters=adapters, samples=samples
        )
    except (EvalError, TrainingError, PlanError, PlacementError) as error:
        print(f"rft eval: {error}", file=sys.stderr)
        return 1
    report = build_report(config, args.config, policies, len(rows), samples)
    print(write_report(report, out))
    print(f"rft eval: wrote {out / REPORT_FILE} and {out / PLOT_FILE}")
    return 0
