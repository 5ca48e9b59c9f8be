"""``StickyRouter``: a rollout stays on its replica; new rollouts go where fewest calls are out."""

from __future__ import annotations

import pytest

from policy_server.engines.ray.routing import NoLiveReplica, StickyRouter


def test_new_rollouts_balance_by_outstanding_calls_and_then_stick() -> None:
    router = StickyRouter(3)
    router.begin(router.route("a", {0, 1, 2}))  # -> 0 (all idle: the lowest index)
    router.begin(router.route("b", {0, 1, 2}))  # -> 1
    router.begin(router.route("a", {0, 1, 2}))  # a's second call stays on 0 although 0 is busiest
    assert [router.assignment(r) for r in "ab"] == [0, 1] and router.outstanding == [2, 1, 0]
    assert router.route("c", {0, 1, 2}) == 2
    router.end(0)
    router.end(0)
    assert router.route("d", {0, 1}) == 0  # 2 is not live; 0 has no call out now, 1 has one


def test_a_rollout_whose_replica_is_gone_moves_and_is_counted() -> None:
    router = StickyRouter(2)
    assert router.route("a", {0, 1}) == 0
    assert router.route("a", {1}) == 1 and router.moved == 1
    assert router.route("a", {0, 1}) == 1  # it stays where it moved
    with pytest.raises(NoLiveReplica, match="no inference replica is live"):
        router.route("a", set())


def test_assignments_are_bounded_least_recently_used_first() -> None:
    router = StickyRouter(2, max_remembered=2)
    router.route("a", {0})
    router.route("b", {0})
    router.route("a", {0})  # a is now the most recent
    router.route("c", {0})
    assert router.assignment("b") is None and router.assignment("a") == 0 == router.assignment("c")
