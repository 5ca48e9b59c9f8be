"""The table of docs/placement.md: `rft plan`'s verdict for the seeds' models on three nodes, from their
published config.json (tests/trainer/model_configs), engine vllm, everything else at its default, so
the plan chooses what it may; for a config that does not fit, the change the refusal suggests. Run:
`python bench/plan_table.py` (prints Markdown rows)."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from trainer.config import TrainConfig
from trainer.scale.choices import advice, resolve
from trainer.scale.memory import GB
from trainer.scale.placement import Gpu, Node
from trainer.scale.plan import shape_for

CONFIGS = Path(__file__).resolve().parent.parent / "tests" / "trainer" / "model_configs"
MODELS = {
    "gpt-oss-20b": "gpt-oss-20b",
    "Gemma 4 31B": "gemma-4-31b",
    "Qwen 3.6 27B": "qwen3.6-27b",
    "Qwen3-VL-8B": "qwen3-vl-8b",
    "Llama-3.3-70B": "llama-3.3-70b",
    "Qwen3-30B-A3B": "qwen3-30b-a3b",
}
NODES = {"1 x 80 GB": (1, 80), "1 x 141 GB": (1, 141), "8 x 80 GB": (8, 80)}


def row(name: str, directory: Path) -> str:
    cells = [name]
    for count, memory in NODES.values():
        config = TrainConfig.model_validate({"model": str(directory), "engine": "vllm"})
        node = Node([Gpu(index, int(memory * GB)) for index in range(count)], present=True)
        resolved = resolve(config, shape_for(directory), node)
        plan = resolved.plan
        peak = max(device.peak[0] for device in plan.devices) / GB
        chosen = "; ".join(choice.split(" (")[0].split(",")[0] for choice in plan.choices) or "nothing"
        verdict = "fits"
        if not plan.fits:
            suggested = re.search(r"it fits with (\S+)", advice(resolved.config, plan))
            verdict = "does not fit" + (f" (fits with {suggested.group(1)})" if suggested else "")
        cells.append(f"{verdict}, peak {peak:.1f} GB; {chosen}")
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    print("| model | " + " | ".join(NODES) + " |")
    print("|---" * (len(NODES) + 1) + "|")
    with tempfile.TemporaryDirectory() as scratch:
        for name, stem in MODELS.items():
            directory = Path(scratch) / stem
            directory.mkdir()
            shutil.copy(CONFIGS / f"{stem}.json", directory / "config.json")
            print(row(name, directory))


if __name__ == "__main__":
    main()
