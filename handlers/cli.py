"""The ``rft`` command. Each subcommand lives in its own module, imported only when it runs, so the
agent side (``rft smoke``) works in a container without torch."""

from __future__ import annotations

import importlib
import os
import sys
import warnings

# name -> (module:function taking argv and returning an exit code, one-line summary)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "smoke": ("handlers.smoke_cli:main", "check that a deployed agent parses, calls its model and reports"),
    "serve": ("policy_server.cli:main", "serve a model through the OpenAI-compatible policy gateway"),
    "model": (
        "policy_server.models.model_cli:main",
        "write a model directory: tiny (random, offline) or smollm2",
    ),
    "tiny-model": (
        "policy_server.models.model_cli:tiny_model_main",
        "the old name of `rft model tiny`",
    ),
    "sft": ("agents.maze.demo.sft:main", "supervised warm start of a LoRA adapter on demonstrations"),
    "collect": (
        "trainer.distill.collect_cli:main",
        "a teacher plays the config's agents; good episodes become demonstrations for rft sft",
    ),
    "plan": (
        "trainer.scale.plan_cli:main",
        "estimate a config's memory per device and refuse one that cannot fit",
    ),
    "train": ("trainer.cli:main", "GRPO on a LoRA adapter from a YAML or TOML config"),
    "demo": ("agents.maze.demo.demo:main", "the CPU demo: a tiny policy learns to walk mazes"),
    "eval": (
        "trainer.evaluate.cli:main",
        "evaluate the base model and adapters on the eval file, no training: success, reward, vs base",
    ),
    "status": ("trainer.ops.status:main", "a table of a run in progress or finished, from its directory"),
    "show": ("trainer.ops.show:main", "the episodes a run kept: messages, tool calls, rewards, failures"),
    "export": (
        "trainer.export.cli:main",
        "write a run's adapter (or merged weights) for serving, checked against the trained policy",
    ),
}


# peft asks every model it wraps for this transformers property, which transformers deprecates: a
# FutureWarning on every command that loads an adapter, about nothing a user of rft can change.
_PEFT_DEPRECATION = "`is_gradient_checkpointing` is deprecated"


def _quiet_libraries() -> None:
    """Silence what the libraries rftkit loads models with print on every command and no user can act
    on: transformers' per-load progress bars ("Loading weights", "Writing model shards"; read by
    huggingface_hub when it is imported, so set before any subcommand imports it) and peft's
    FutureWarning above, in this process and in the Python processes it starts (learner workers, Ray
    actors). rftkit's own output (its progress bars, logs and lines) is untouched; a value the user
    exported wins."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", message=_PEFT_DEPRECATION, category=FutureWarning)
    ignore = f"ignore:{_PEFT_DEPRECATION}:FutureWarning"
    given = os.environ.get("PYTHONWARNINGS", "")
    if ignore not in given.split(","):
        os.environ["PYTHONWARNINGS"] = f"{given},{ignore}" if given else ignore


def _usage() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    lines = ["usage: rft COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in SUBCOMMANDS.items()]
    lines += ["", "Run `rft COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"rft: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    target, _ = SUBCOMMANDS[name]
    # rftkit downloads no model: with this, transformers (and a vLLM server started from here) fail
    # at once on a path that is not a local directory instead of retrying the hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _quiet_libraries()
    module_name, function_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name in ("torch", "transformers", "peft", "tokenizers", "prometheus_client"):
            print(
                f"rft {name} needs the training extras ({exc.name} is not installed): "
                "pip install 'rftkit[train]'",
                file=sys.stderr,
            )
            return 2
        raise
    return int(getattr(module, function_name)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
