"""Pacing of rollouts by step: synchronous (k = 0) or asynchronous with bounded staleness (k >= 1).

``k`` is the config's ``max_off_policy_steps``. The rule: the rollouts of step ``s`` are submitted
once the learner has finished step ``s - 1 - k`` and published its adapter, and all of them sample
on that adapter, the one the learner held after step ``max(0, s - 1 - k)``. So while the learner
trains on step ``s``, the rollouts of steps ``s + 1 .. s + k`` are being played, and no rollout is
ever more than ``k`` adapter versions behind the policy it trains. Staleness is bounded by when
rollouts start, never by throwing finished ones away. Which version a rollout samples on depends on
its step alone, never on timing, so a seeded run repeats its numbers exactly.

A checkpoint keeps the steps submitted but not yet trained on: their rows, the adapter version they
sample on (the adapter directory goes into the checkpoint) and every rollout already finished, with
its outcome and trace. A resumed run trains on those finished rollouts as they are and plays again
only the ones that were still in flight, on the same adapter version with the same seeds.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from policy_server import RolloutTrace
from trainer.rollouts.fanout import FailureCause, RolloutRequest
from trainer.rollouts.outcomes import RolloutOutcome
from trainer.rollouts.producer import PlayedRollout, RolloutProducer, StepRollouts

log = logging.getLogger(__name__)

# Builds a step's requests (G per row, their seeds) from the step and its rows.
# Makes a step's requests from its (row index, row) pairs.
RequestFactory = Callable[[int, list[tuple[int, Any]]], list[RolloutRequest]]
# Picks the next rows: (row index, row) pairs.
RowPicker = Callable[[], list[tuple[int, Any]]]


class RolloutPipeline:
    """Which steps' rollouts are in flight, on which adapter version, and what they sampled on."""

    def __init__(
        self,
        producer: RolloutProducer,
        *,
        max_off_policy_steps: int,
        max_steps: int,
        make_requests: RequestFactory,
    ) -> None:
        self.producer = producer
        self.k = max_off_policy_steps
        self.max_steps = max_steps
        self.make_requests = make_requests
        self.pending: dict[int, StepRollouts] = {}
        self.submitted_up_to = 0

    def fill(self, step: int, adapter_version: int, pick_rows: RowPicker) -> None:
        """Called when the learner is about to train ``step``, holding ``adapter_version``: submit
        every step up to ``step + k`` not yet submitted, sampling on that version."""
        self.submitted_up_to = max(self.submitted_up_to, step - 1)
        while self.submitted_up_to < min(step + self.k, self.max_steps):
            target = self.submitted_up_to + 1
            picked = pick_rows()
            requests = self.make_requests(target, picked)
            rollouts = StepRollouts(
                target, adapter_version, [index for index, _ in picked], requests, [None] * len(requests)
            )
            self._submit(rollouts)
            self.submitted_up_to = target

    def take(self, step: int) -> StepRollouts:
        """Wait for ``step``'s rollouts (submitted by :meth:`fill`) and hand them over."""
        rollouts = self.pending.pop(step)
        rollouts.wait()
        return rollouts

    def _submit(self, rollouts: StepRollouts) -> None:
        log.info("step %d: rollouts started (adapter v%d)", rollouts.step, rollouts.adapter_version)
        self.pending[rollouts.step] = rollouts
        self.producer.submit(rollouts, rollouts.adapter_version)

    @staticmethod
    def staleness(rollouts: StepRollouts, learner_version: int) -> dict[str, float]:
        """How many adapter versions the step's rollouts lag the policy the learner updates.

        Every call of a rollout samples on the step's pinned version; rollouts that made no call
        sampled nothing and are left out.
        """
        lags = [
            learner_version - rollouts.adapter_version
            for played in rollouts.played
            if played and played.trace.calls
        ]
        if not lags:
            return {"mean": 0.0, "max": 0.0}
        return {"mean": math.fsum(lags) / len(lags), "max": float(max(lags))}

    def pinned_versions(self) -> list[int]:
        """Adapter versions the steps in flight sample on (a checkpoint keeps their adapters)."""
        return sorted({rollouts.adapter_version for rollouts in self.pending.values()})

    def snapshot(self) -> list[dict[str, Any]]:
        """The steps in flight, JSON-ready: rows, adapter version and the rollouts already finished."""
        return [
            {
                "step": rollouts.step,
                "adapter_version": rollouts.adapter_version,
                "row_indices": rollouts.row_indices,
                "finished": {
                    str(index): {
                        "outcome": asdict(played.outcome),
                        "trace": played.trace.model_dump(mode="json"),
                    }
                    for index, played in rollouts.finished().items()
                },
            }
            for rollouts in sorted(self.pending.values(), key=lambda rollouts: rollouts.step)
        ]

    def resume(self, snapshot: list[dict[str, Any]], rows: list[Any]) -> None:
        """Submit again the steps a checkpoint had in flight: their finished rollouts kept as they
        were, the others played again (same rows, seeds and adapter version)."""
        for saved in snapshot:
            step, indices = saved["step"], saved["row_indices"]
            requests = self.make_requests(step, [(index, rows[index]) for index in indices])
            played: list[PlayedRollout | None] = [None] * len(requests)
            for key, kept in saved["finished"].items():
                request = requests[int(key)]
                played[int(key)] = PlayedRollout(
                    request, _outcome(kept["outcome"]), RolloutTrace.model_validate(kept["trace"])
                )
            log.info(
                "step %d: %d rollouts kept from the checkpoint, %d played again",
                step,
                len(saved["finished"]),
                len(requests) - len(saved["finished"]),
            )
            self._submit(StepRollouts(step, saved["adapter_version"], indices, requests, played))
            self.submitted_up_to = max(self.submitted_up_to, step)


def _outcome(data: dict[str, Any]) -> RolloutOutcome:
    cause = data.get("cause")
    return RolloutOutcome(**{**data, "cause": FailureCause(cause) if cause is not None else None})


def adapter_dirs(run_dir: Path, versions: list[int]) -> dict[int, Path]:
    """The saved adapter directory of each version (version 0, the base model, has none)."""
    return {version: run_dir / "adapters" / f"v{version}" for version in versions if version > 0}
