"""Train tokens with and without merging calls, on maze-shaped episodes whose observations are images.

Each episode is a visual-maze agent's calls: a system prompt and one ``move`` tool, the first
observation (a PNG of the grid) in the user message and every later one in the ``move`` tool's
result. Prompts are rendered as the hf engine renders them for the tiny VLM (chat template, then
each ``<|image_pad|>`` expanded to the image's patch tokens by ``policy_server/models/vision_inputs.py``);
the completion is the assistant turn the template renders (a canonical tool call ending in
``<|im_end|>``). The traces carry their images' ``ImageRef`` s as the policy server records them and
go through :func:`trainer.algo.sequences.count_train_tokens` and
:func:`trainer.algo.sequences.build_sequences`.

    .venv/bin/python bench/vision_merge_ratio.py [--games 16] [--turns 6] [--seed 0] \
        [--out bench/results/vision_merge_ratio.json]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from policy_server.http.images import ImageLimits, locate_images, request_images
from policy_server.models.tiny_vision import build_tiny_vision_model
from policy_server.models.vision_inputs import VisionInputs
from policy_server.trace import CallRecord, RolloutTrace
from trainer.algo.sequences import build_sequences, count_train_tokens

SIZE, CELLS = 64, 8
MOVES = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}
MOVE_TOOL = {
    "type": "function",
    "function": {
        "name": "move",
        "description": "Move one step in the maze; returns the new view.",
        "parameters": {
            "type": "object",
            "properties": {"direction": {"type": "string", "enum": list(MOVES)}},
            "required": ["direction"],
        },
    },
}
SYSTEM = "You walk a maze you see as an image: walls black, you blue, the goal green. Call move."


def maze_png(agent: tuple[int, int], goal: tuple[int, int]) -> str:
    """A data URL of the grid as the agent sees it."""
    cell = SIZE // CELLS
    image = Image.new("RGB", (SIZE, SIZE), "white")
    draw = ImageDraw.Draw(image)
    for x in range(CELLS):
        draw.rectangle((x * cell, 0, x * cell + cell - 1, cell - 1), fill="black")
    for (x, y), color in ((goal, "green"), (agent, "blue")):
        draw.rectangle((x * cell, y * cell, x * cell + cell - 1, y * cell + cell - 1), fill=color)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_content(url: str, text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]


def record(
    tokenizer: Any, vision: VisionInputs, rollout: str, turns: int, rng: random.Random
) -> RolloutTrace:
    """One episode's trace: each call's prompt and canonical completion, images located in the prompt."""
    agent, goal = (rng.randrange(1, CELLS), rng.randrange(1, CELLS)), (rng.randrange(1, CELLS), 1)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": image_content(maze_png(agent, goal), "Reach the goal.")},
    ]
    calls = []
    for index in range(turns):
        direction = rng.choice(list(MOVES))
        step = MOVES[direction]
        agent = (min(max(agent[0] + step[0], 0), CELLS - 1), min(max(agent[1] + step[1], 1), CELLS - 1))
        call = {"type": "function", "function": {"name": "move", "arguments": {"direction": direction}}}
        turn = messages + [{"role": "assistant", "content": "", "tool_calls": [call]}]
        images = request_images(messages, ImageLimits())
        grid = vision.pixels(images)["image_grid_thw"]
        prompt_text = tokenizer.apply_chat_template(
            messages, tools=[MOVE_TOOL], tokenize=False, add_generation_prompt=True
        )
        turn_text = tokenizer.apply_chat_template(turn, tools=[MOVE_TOOL], tokenize=False)
        completion_text = turn_text[len(prompt_text) : turn_text.rindex("<|im_end|>") + len("<|im_end|>")]
        prompt_ids = vision.expand(tokenizer(prompt_text, add_special_tokens=False)["input_ids"], grid)
        completion_ids = tokenizer(completion_text, add_special_tokens=False)["input_ids"]
        calls.append(
            CallRecord(
                index=index,
                prompt_token_ids=prompt_ids,
                completion_token_ids=completion_ids,
                completion_logprobs=[-1.0] * len(completion_ids),
                adapter_version=0,
                finish_reason="tool_calls",
                started_at=0.0,
                finished_at=0.0,
                images=locate_images(prompt_ids, vision.image_token_id, images),
            )
        )
        messages = turn + [
            {
                "role": "tool",
                "tool_call_id": f"c{index}",
                "content": image_content(maze_png(agent, goal), "moved"),
            }
        ]
    return RolloutTrace(job_arn="bench", rollout_id=rollout, calls=calls)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=16)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/vision_merge_ratio.json"))
    args = parser.parse_args(argv)
    from transformers import AutoConfig, AutoTokenizer

    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = build_tiny_vision_model(Path(scratch) / "tiny-vision", seed=0)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        vision = VisionInputs(model_dir, AutoConfig.from_pretrained(model_dir))
        rng = random.Random(args.seed)
        traces = [record(tokenizer, vision, f"game-{n}", args.turns, rng) for n in range(args.games)]
    counts = count_train_tokens(traces)
    sequences = [sequence for trace in traces for sequence in build_sequences(trace)]
    image_tokens = sum(ref.length for sequence in sequences for ref in sequence.images)
    result = {
        "command": "bench/vision_merge_ratio.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "games": args.games,
        "turns": args.turns,
        "merged_train_tokens": counts.merged,
        "per_call_train_tokens": counts.per_call,
        "ratio": round(counts.ratio, 4),
        "sequences_per_game": len(sequences) / args.games,
        "images_per_game": sum(len(s.images) for s in sequences) / args.games,
        "image_token_share_of_merged": round(image_tokens / counts.merged, 4),
        "seconds": round(time.monotonic() - started, 2),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
