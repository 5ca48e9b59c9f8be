"""bench/ray_overhead.py and bench/adapter_transfer.py at their smallest, on one local Ray cluster: every
side timed, the Ray step split into its phases, the bfloat16 adapter half the float32 one's bytes (the
full runs are in docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import ray

from trainer.scale.ray_cluster import start_local_cluster

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _module(name: str) -> ModuleType:
    """The bench's module, in sys.modules only while it executes (its dataclasses need it there): the
    functions it sends to Ray workers, which cannot import bench/, then travel by value."""
    spec = importlib.util.spec_from_file_location(f"{name}_bench", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    start_local_cluster(3, log_to_driver=False)  # three learner workers, or three replicas
    yield
    ray.shutdown()


def test_the_ray_learner_step_is_timed_against_one_process_and_split(
    cluster: None, tiny_model_dir: Path
) -> None:
    bench = _module("ray_overhead")
    result = bench.measure(tiny_model_dir, sequences=4, length=12, micro_tokens=24, repeats=1)
    assert result["micro_batches"] == 2 and result["batch_pickled_bytes"] > 0
    assert result["worker_torch_threads"] == [1, 1, 1]  # one worker, then two
    assert set(result["workers"]) == {"ray_1_workers", "ray_2_workers"}
    for entry in result["workers"].values():
        for call in ("step", "adapter"):
            timed = entry[call]
            assert timed["ray_over_one_process"] == timed["ray_median_s"] / timed["one_process_median_s"]
            split = timed["ray_split_s"]
            # The slowest worker's task ran inside the driver's call, its phases inside the task.
            assert 0 < split["task"] <= timed["ray_median_s"]
            assert split["arguments"] + split["execute"] + split["store_outputs"] <= split["task"]
        assert 0 < entry["step"]["ray_split_s"]["gradient_exchange"] < entry["step"]["ray_split_s"]["execute"]


def test_a_bfloat16_adapter_travels_at_half_the_bytes(cluster: None, tmp_path: Path) -> None:
    bench = _module("adapter_transfer")
    result = asyncio.run(bench.measure(replicas=1, repeats=1, rank=1, work=tmp_path))
    float32, bfloat16 = result["object_store"], result["object_store_bfloat16"]
    assert float32["weights_bytes"] >= result["adapter_bytes"]  # the weights and the file's header
    assert bfloat16["weights_bytes"] < 0.51 * float32["weights_bytes"]
    assert all(result[mode]["median_s"] > 0 for mode in bench.MODES)
    assert result["bfloat16_over_float32"] == bfloat16["median_s"] / float32["median_s"]
