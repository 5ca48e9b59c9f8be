"""``rft plan CONFIG``: the memory plan of a training config with the settings the plan chooses to make
it fit (:mod:`trainer.scale.choices`, as ``rft train`` applies them), printed (or as JSON), and
refused with the change that makes it fit when no choice does (:mod:`trainer.scale.plan`)."""

from __future__ import annotations

import argparse
import json
import sys

from trainer.config import ConfigError, load_config
from trainer.reasoning import reasoning_note
from trainer.scale.choices import advice, resolve
from trainer.scale.placement import PlacementError, detect_gpus, node_for
from trainer.scale.plan import PlanError, render, shape_for


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rft plan",
        description="Estimate the memory a training config needs on each device, from the model's "
        "config.json, and refuse one that cannot fit.",
    )
    parser.add_argument("config", help="YAML or TOML training config (see docs/config.md)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, as for rft train")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``rft plan CONFIG [KEY=VALUE ...]``: print the plan; exit 1 when it does not fit."""
    args = _parser().parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
        if config.model is None:
            print("model is unset: the run builds a tiny model (under 1 M parameters) and needs no plan")
            return 0
        shape = shape_for(config.model)
        node = node_for(config, detect_gpus())
        resolved = resolve(config, shape, node)
        plan = resolved.plan
    except (ConfigError, PlanError, PlacementError) as error:
        print(f"rft plan: {error}", file=sys.stderr)
        return 2
    print(json.dumps(plan.as_dict(), indent=2) if args.json else render(plan))
    note = reasoning_note(config, config.model)
    if note is not None:
        print(f"note: {note}", file=sys.stderr if args.json else sys.stdout)
    if not plan.fits:
        print(f"refused: {advice(resolved.config, plan)}", file=sys.stderr)
        return 1
    return 0
