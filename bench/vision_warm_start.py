"""How far a warm start teaches the tiny VLM to read the maze picture: one ``rft sft`` run on picture
demonstrations, its held-out loss every few steps, and (``--mazes N``) the exact success of its moves on
the first N evaluation mazes (``agents.maze.demo.maze_exact``: no sampling error).

The held-out loss is the mean over assistant tokens (about 20 a call); a policy that cannot tell the
four directions apart sits near ln(4) / 20 = 0.069 however well it writes the call. So the curve
says at once whether the picture is being read. Writes ``bench/results/vision_warm_start.json``
(one entry per run, keyed by its settings).

    .venv/bin/python bench/vision_warm_start.py --steps 300 [--depth 3 --width 128 --heads 4]
    .venv/bin/python bench/vision_warm_start.py --steps 1000 --learning-rate 1e-3 --rope-theta 10 \
        --mrope 2,15,15 --mazes 16                                  # the demo's VISION warm start
    .venv/bin/python bench/vision_warm_start.py --cell-px 8 --min-side 64 --steps 300   # the old one
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from agents.maze import picture
from agents.maze.dataset import eval_rows, row_maze
from agents.maze.demo.maze_exact import CallScorer, exact_success
from agents.maze.demo.model import SFT_HELD_OUT_FIRST_SEED, SFT_HELD_OUT_MAZES, maze_corpus
from agents.maze.demo.plans import TINY_TARGET_MODULES, VISION_TOWER_MODULES
from agents.maze.demonstrations import maze_demonstrations
from policy_server.models import MRope, VisionTower, build_tiny_vision_model
from trainer.sft import StopAtLoss, run_sft

RESULTS = Path(__file__).parent / "results" / "vision_warm_start.json"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=50, help="held-out loss every this many steps")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--demos", type=int, default=200, help="training mazes walked for demonstrations")
    parser.add_argument("--labels", choices=("walker", "shortest"), default="shortest")
    parser.add_argument("--noise", type=float, default=0.3, help="the walker's chance of a random move")
    parser.add_argument("--depth", type=int, default=2, help="vision tower blocks")
    parser.add_argument("--width", type=int, default=64, help="vision tower width")
    parser.add_argument("--heads", type=int, default=2, help="vision tower attention heads")
    parser.add_argument(
        "--rope-theta", type=float, default=10000.0, help="the language model's M-RoPE base (Qwen2-VL's: 1e4)"
    )
    parser.add_argument(
        "--mrope", default="16,8,8", help="M-RoPE frequencies of time,height,width (sum 32; Qwen2-VL's shape)"
    )
    parser.add_argument(
        "--cell-px",
        type=int,
        default=picture.CELL_PX,
        help="pixels a maze cell is drawn with (the agent's: 16, one merged token a cell; 8: one patch); "
        "sets agents.maze.picture.CELL_PX (and --min-side MIN_SIDE) for this process",
    )
    parser.add_argument(
        "--min-side",
        type=int,
        default=picture.MIN_SIDE,
        help="the picture's smallest side in pixels (the agent's: 96; 64 before cells were 16 pixels)",
    )
    parser.add_argument("--mazes", type=int, default=0, help="evaluation mazes scored exactly (0: none)")
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    picture.CELL_PX, picture.MIN_SIDE = args.cell_px, args.min_side
    sections = tuple(int(part) for part in args.mrope.split(","))
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        model = build_tiny_vision_model(
            out / "model",
            seed=args.seed,
            corpus=maze_corpus(300, "image"),
            tower=VisionTower(args.depth, args.width, args.heads),
            rope=MRope(args.rope_theta, sections),  # type: ignore[arg-type]
        )

        def demonstrations(count: int, first_seed: int = 0) -> list[dict]:
            return maze_demonstrations(
                count, first_seed, noise=args.noise, seed=args.seed, labels=args.labels, observation="image"
            )

        held_out = demonstrations(SFT_HELD_OUT_MAZES, SFT_HELD_OUT_FIRST_SEED)
        sft = run_sft(
            model,
            demonstrations(args.demos),
            out / "adapter",
            steps=args.steps,
            learning_rate=args.learning_rate,
            batch_size=args.batch_size,
            target_modules=[*TINY_TARGET_MODULES, *VISION_TOWER_MODULES],
            seed=args.seed,
            stop=StopAtLoss(held_out, 0.0, every=args.every),  # a target never reached: the curve only
        )
        exact = None
        if args.mazes:
            mazes = [row_maze(row) for row in eval_rows()[: args.mazes]]
            exact = exact_success(mazes, CallScorer(model, out / "adapter"), observation="image").success
    settings = {key: value for key, value in vars(args).items() if key != "threads"}
    entry = {
        "settings": settings,
        "held_out_loss": {str(step): round(loss, 4) for step, loss in sft.held_out_losses.items()},
        "exact_success": exact,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(entry))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    runs = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    runs[json.dumps(settings, sort_keys=True)] = entry
    RESULTS.write_text(json.dumps(runs, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
