"""Inference replicas on a real local Ray cluster: sticky routing, adapter fan-out, a replica killed
mid-call, and `rft train` with a replica killed during a step.

One cluster per module (``ray.init`` costs seconds); two replicas of the tiny model on the hf engine.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from agents.letters import main as letters
from agents.letters.run_files import serving, write_run_files
from handlers.context import RolloutContext
from handlers.decorator import rft_app
from policy_server.engines.ray.engine import RayEngine
from policy_server.http.chat_api import ChatCompletionRequest
from policy_server.running import ServerThread
from policy_server.server import PolicyServer
from trainer.config import load_config, validate_config
from trainer.loop import train
from trainer.scale.ray_cluster import ray_engine, start_local_cluster

JOB = "job-ray"


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    # Room for the module's two replicas and, in the train test, its own two and a learner worker.
    start_local_cluster(8, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def served(cluster: None, tiny_model_dir: Path) -> Iterator[tuple[PolicyServer, ServerThread, RayEngine]]:
    """The gateway over two Ray replicas of the tiny model, shared by the engine-level tests."""
    config = validate_config(
        {"model": str(tiny_model_dir), "train_file": "unused.jsonl", "ray": {"inference_replicas": 2}}
    )
    engine = ray_engine(config, tiny_model_dir)
    assert isinstance(engine, RayEngine)
    server = PolicyServer(engine)
    thread = ServerThread(server)
    thread.start()
    server.open_job(JOB, max_tokens=64, max_calls_per_rollout=64)
    yield server, thread, engine
    thread.stop()


def _call(server: PolicyServer, rollout: str, text: str, *, seed: int, max_tokens: int = 8) -> Any:
    request = ChatCompletionRequest.model_validate(
        {
            "model": "policy",
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "seed": seed,
        }
    )
    return server.complete(JOB, rollout, request)


def _play(thread: ServerThread, calls: Callable[[], Any]) -> Any:
    async def run() -> Any:
        return await calls()

    return thread.run(run())


def test_rollouts_stick_to_one_replica_and_new_ones_balance(served: Any) -> None:
    server, thread, engine = served
    rollouts = [f"sticky-{index}" for index in range(6)]
    for rollout in rollouts:
        server.open_rollout(JOB, rollout)

    async def two_turns(rollout: str, seed: int) -> None:
        await _call(server, rollout, "name a fruit", seed=seed)
        await _call(server, rollout, "name a fruit, say more", seed=seed)

    before = list(engine.router.calls)
    _play(thread, lambda: asyncio.gather(*(two_turns(r, i) for i, r in enumerate(rollouts))))
    calls = [after - earlier for after, earlier in zip(engine.router.calls, before, strict=True)]
    placed = [engine.router.assignment(rollout) for rollout in rollouts]
    # Six rollouts started together: three per replica (each new one to the replica with fewer
    # calls out), and every rollout's two calls on its replica: 6 calls each.
    assert sorted(placed) == [0, 0, 0, 1, 1, 1]
    assert calls == [6, 6] and engine.router.outstanding == [0, 0]
    for rollout in rollouts:
        trace = server.take_trace(JOB, rollout)
        assert len(trace.calls) == 2


def test_adapter_reaches_every_replica_before_it_is_current(
    served: Any, random_adapter: Callable[..., Path], tmp_path: Path
) -> None:
    server, thread, engine = served
    version = thread.run(server.load_adapter(random_adapter(tmp_path / "a", seed=5)))
    loaded = [ray.get(replica.loaded_adapters.remote()) for replica in engine.replicas]
    assert all(version in versions for versions in loaded) and server.current_adapter_version == version
    # The same seeded call on each replica samples the same tokens with the same logprobs: both
    # hold the same weights (and a different adapter would change them: the adapter is random).
    results = []
    for replica in range(2):
        rollout = f"adapter-{replica}"
        server.open_rollout(JOB, rollout)
        engine.router._assigned[rollout] = replica  # pin the rollout to the replica under test
        results.append(_play(thread, lambda r=rollout: _call(server, r, "count to five", seed=11)))
        trace = server.take_trace(JOB, rollout)
        assert trace.calls[0].adapter_version == version
    assert results[0].completion_token_ids == results[1].completion_token_ids
    assert results[0].completion_logprobs == results[1].completion_logprobs


def test_a_replica_killed_mid_call_fails_over_and_comes_back_with_the_adapter(
    served: Any, random_adapter: Callable[..., Path], tmp_path: Path
) -> None:
    server, thread, engine = served
    next_adapter = random_adapter(tmp_path / "next", seed=6)
    rollouts = [f"kill-{index}" for index in range(8)]
    for rollout in rollouts:
        server.open_rollout(JOB, rollout)
    deaths, failovers = engine.events.deaths, engine.events.failovers
    # Replica 0 frozen (SIGSTOP) before the calls, so the ones sent to it are still in flight when it
    # is killed: the tiny model answers faster than a kill lands, and on a loaded machine a replica
    # killed once busy had sometimes answered every call first.
    pid = ray.get(engine.replicas[0].__ray_call__.remote(lambda _: os.getpid()))
    os.kill(pid, signal.SIGSTOP)

    async def kill_when_busy() -> None:
        while engine.router.outstanding[0] == 0:
            await asyncio.sleep(0.005)
        ray.kill(engine.replicas[0], no_restart=False)

    async def play() -> list[Any]:
        killer = asyncio.create_task(kill_when_busy())
        results = await asyncio.gather(
            *(
                _call(server, rollout, "describe the sky", seed=i, max_tokens=48)
                for i, rollout in enumerate(rollouts)
            )
        )
        await killer
        return results

    results = _play(thread, play)
    # Every call answered: the killed replica's calls were sent again to replica 1.
    assert len(results) == 8 and all(result.completion_token_ids for result in results)
    assert engine.events.deaths == deaths + 1 and engine.events.failovers > failovers
    assert "replica 0" in engine.events.errors[-1]
    for rollout in rollouts:
        assert len(server.take_trace(JOB, rollout).calls) == 1  # recorded once, not per try
    # A version loaded while replica 0 is down is current once the live replica holds it ...
    assert 0 not in engine.live
    version = thread.run(server.load_adapter(next_adapter))
    assert server.current_adapter_version == version
    # ... and Ray restarts the actor, which rejoins only after loading the versions in use.
    deadline = time.monotonic() + 60
    while 0 not in engine.live and time.monotonic() < deadline:
        time.sleep(0.2)
    assert 0 in engine.live and engine.events.recoveries >= 1
    assert server.current_adapter_version in ray.get(engine.replicas[0].loaded_adapters.remote())


def _killing_app(kill: Callable[[], None]) -> Any:
    """The letters agent, except that step 2's first rollout kills replica 0 after its first call."""

    async def rollout(row: dict[str, Any], ctx: RolloutContext) -> dict[str, Any]:
        if ctx.rollout_id.startswith("s2-g0-0-"):
            original = ctx.async_openai_client

            def client() -> Any:
                opened = original()
                create = opened.chat.completions.create

                async def create_then_kill(**kwargs: Any) -> Any:
                    answer = await create(**kwargs)
                    kill()
                    return answer

                opened.chat.completions.create = create_then_kill
                return opened

            ctx.async_openai_client = client  # type: ignore[method-assign]
        return await letters.rollout(row, ctx)

    return rft_app(rollout)


def test_train_goes_on_when_a_replica_dies_mid_step(
    cluster: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    killed = threading.Event()

    def kill() -> None:
        if killed.is_set():
            return
        killed.set()
        (name,) = [
            n["name"]
            for n in ray.util.list_named_actors(all_namespaces=True)
            if n["name"].endswith("-replica-0") and "ray-run" in n["name"]
        ]
        ray.kill(ray.get_actor(name), no_restart=False)

    fields = {"ray": {"inference_replicas": 2}, "eval_file": None, "output_dir": "ray-run"}
    with serving(_killing_app(kill)) as agent_url:
        summary = train(load_config(write_run_files(tmp_path, tiny_model_dir, agent_url, **fields)))
    records = [json.loads(line) for line in (summary.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert killed.is_set() and summary.steps == 3
    assert [record["rollouts"]["failed"] for record in records] == [0, 0, 0]
    step2 = records[1]["replicas"]
    assert step2["deaths"] == 1
    # The killed replica's rollouts went on elsewhere: calls in flight sent again, later calls moved.
    assert step2["failovers"] + step2["moved_rollouts"] >= 1


def test_replicas_the_cluster_cannot_place_fail_to_start_with_a_sentence(
    cluster: None, tiny_model_dir: Path
) -> None:
    # Ray leaves an actor whose resources no node has pending forever; the engine must not wait forever.
    config = validate_config(
        {
            "model": str(tiny_model_dir),
            "train_file": "unused.jsonl",
            "ray": {
                "inference_replicas": 1,
                "replica_resources": {"no_such_node": 1},
                "recovery_timeout_s": 2,
            },
        }
    )
    engine = ray_engine(config, tiny_model_dir)
    with pytest.raises(
        RuntimeError, match=r"did not all start within 2 s \(ray.recovery_timeout_s\)"
    ) as stopped:
        asyncio.run(engine.start())
    for replica in engine.replicas:
        ray.kill(replica)
    message = str(stopped.value)
    assert "each asks for 1 CPU, 1 no_such_node; the cluster has 8 CPU, 0 no_such_node in all" in message


def test_a_vllm_replicas_first_start_waits_for_vllms_startup_timeout(
    cluster: None, tiny_model_dir: Path
) -> None:
    # A GPU vLLM compiles and captures graphs before it serves: ray.recovery_timeout_s (a restart's
    # model load) is not its bound, vllm.startup_timeout_s is.
    config = validate_config(
        {
            "model": str(tiny_model_dir),
            "train_file": "unused.jsonl",
            "engine": "vllm",
            "vllm": {"startup_timeout_s": 2},
            "ray": {
                "inference_replicas": 1,
                "replica_resources": {"no_such_node": 1},
                "recovery_timeout_s": 300,
            },
        }
    )
    engine = ray_engine(config, tiny_model_dir)
    started = time.monotonic()
    with pytest.raises(
        RuntimeError, match=r"did not all start within 2 s \(vllm.startup_timeout_s\)"
    ) as stopped:
        asyncio.run(engine.start())
    for replica in engine.replicas:
        ray.kill(replica)
    assert time.monotonic() - started < 60
    assert "or raise vllm.startup_timeout_s if the engine needs longer to start" in str(stopped.value)
