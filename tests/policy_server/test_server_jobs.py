"""The job registry on its own: caps, ordering, feedback, freeing traces, counters, two threads at once."""

from __future__ import annotations

import threading
import time
import tracemalloc

import pytest

from handlers.protocol import JOB_NOT_FOUND_MESSAGE, RolloutStatus
from policy_server.jobs import JobLimits, JobRegistry, Rejection
from policy_server.trace import CallRecord

JOB = "arn:aws:sagemaker:us-west-2:123456789012:training-job/registry"


def _record(prompt: int, completion: int, started_at: float) -> CallRecord:
    return CallRecord(
        index=-1,
        prompt_token_ids=list(range(prompt)),
        completion_token_ids=list(range(completion)),
        completion_logprobs=[-1.0] * completion,
        adapter_version=0,
        finish_reason="length",
        started_at=started_at,
        finished_at=started_at + 1,
    )


def test_calls_are_ordered_by_arrival_and_counted() -> None:
    registry = JobRegistry()
    registry.open_job(JOB, JobLimits(max_tokens=8, max_calls_per_rollout=3))
    registry.open_rollout(JOB, "r")
    first, second, third = (registry.start_call(JOB, "r") for _ in range(3))
    with pytest.raises(Rejection) as caught:
        registry.start_call(JOB, "r")
    assert caught.value.status_code == 400 and "max_calls_per_rollout" in caught.value.message
    registry.reject_call(JOB, "r")
    # Finishing out of order still yields the calls in the order they arrived.
    registry.record_call(third, _record(5, 1, 3.0))
    registry.record_call(first, _record(3, 2, 1.0))
    registry.record_call(second, _record(4, 3, 2.0))
    registry.complete_rollout(JOB, "r", RolloutStatus.READY)
    registry.update_reward(JOB, "r", [0.25])

    trace = registry.take_trace(JOB, "r")
    assert [(c.index, c.started_at) for c in trace.calls] == [(0, 1.0), (1, 2.0), (2, 3.0)]
    assert (trace.status, trace.rewards, trace.rejected_calls) == ("ready", [0.25], 1)
    counters = registry.counters(JOB)
    assert (counters.prefill_tokens, counters.sample_tokens, counters.calls, counters.rejected_calls) == (
        12,
        6,
        3,
        1,
    )


def test_unknown_finished_and_closed() -> None:
    registry = JobRegistry()
    with pytest.raises(Rejection, match=JOB_NOT_FOUND_MESSAGE):
        registry.open_rollout(JOB, "r")
    registry.open_job(JOB, JobLimits())
    with pytest.raises(Rejection) as caught:
        registry.open_job(JOB, JobLimits())
    assert caught.value.status_code == 409
    registry.open_rollout(JOB, "r")
    with pytest.raises(Rejection) as caught:
        registry.start_call(JOB, "other")
    assert caught.value.status_code == 404
    ticket = registry.start_call(JOB, "r")
    registry.take_trace(JOB, "r")
    # A call in flight when the trace was taken is counted for the job but lands in no trace.
    registry.record_call(ticket, _record(2, 2, 1.0))
    assert registry.counters(JOB).calls == 1
    for action in (lambda: registry.start_call(JOB, "r"), lambda: registry.open_rollout(JOB, "r")):
        with pytest.raises(Rejection) as caught:
            action()
        assert caught.value.status_code == 409
    final = registry.close_job(JOB)
    assert final.calls == 1
    with pytest.raises(Rejection, match=JOB_NOT_FOUND_MESSAGE):
        registry.counters(JOB)


def test_auto_open_and_flat_memory_over_many_rollouts() -> None:
    kept = 100
    registry = JobRegistry(finished_ids_kept=kept)
    registry.open_job(JOB, JobLimits(auto_open_rollouts=True))

    def play(first: int, count: int) -> None:
        for i in range(first, first + count):
            record = _record(50, 20, float(i))
            registry.record_call(registry.start_call(JOB, f"rollout-{i:06d}"), record)
            assert len(registry.take_trace(JOB, f"rollout-{i:06d}").calls) == 1

    play(0, 500)
    tracemalloc.start()
    play(500, 500)
    after_1000 = tracemalloc.take_snapshot()
    play(1000, 2000)
    after_3000 = tracemalloc.take_snapshot()
    tracemalloc.stop()
    growth = sum(stat.size_diff for stat in after_3000.compare_to(after_1000, "filename"))
    assert growth < 20_000, f"registry grew by {growth} bytes over 2000 finished rollouts"
    assert registry.open_rollout_count(JOB) == 0
    # Recent finished ids are still refused; the oldest fell out of the bounded memory (and would reopen).
    with pytest.raises(Rejection) as caught:
        registry.start_call(JOB, "rollout-002999")
    assert caught.value.status_code == 409
    registry.start_call(JOB, "rollout-000000")
    assert registry.counters(JOB).calls == 3000


def test_gateway_loop_and_trainer_thread_share_the_registry() -> None:
    registry = JobRegistry()
    registry.open_job(JOB, JobLimits(max_calls_per_rollout=1000))
    rollouts = [f"r{i}" for i in range(8)]
    for rollout_id in rollouts:
        registry.open_rollout(JOB, rollout_id)

    def agent(rollout_id: str) -> None:
        for _ in range(200):
            registry.record_call(registry.start_call(JOB, rollout_id), _record(3, 2, time.time()))

    threads = [threading.Thread(target=agent, args=(rollout_id,)) for rollout_id in rollouts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    traces = [registry.take_trace(JOB, rollout_id) for rollout_id in rollouts]
    assert [len(trace.calls) for trace in traces] == [200] * 8
    counters = registry.close_job(JOB)
    assert (counters.calls, counters.prefill_tokens, counters.sample_tokens) == (1600, 4800, 3200)
