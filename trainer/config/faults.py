"""The faults section: what the run does when it is told to stop (SIGTERM: preemption) or stalls."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainer.config.common import _Section


class FaultsConfig(_Section):
    """Preemption (SIGTERM, what Kubernetes and HyperPod send before a kill) and stalls (operations.md)."""

    on_sigterm: Literal["abandon_step", "finish_step"] = Field(
        default="abandon_step",
        description="What SIGTERM does to the step in flight before the checkpoint and exit 0. "
        "abandon_step: if its rollouts are still playing, stop waiting for them: the checkpoint keeps "
        "the rollouts already finished, `--resume` plays the others again with their own seeds and "
        "adapter version (an update already under way is finished). finish_step: finish the step "
        "(rollouts, update, publish) first. A second SIGTERM or Ctrl-C exits at once, keeping the "
        "previous checkpoint.",
    )
    sigterm_grace_s: float = Field(
        default=25.0,
        gt=0,
        description="Seconds from SIGTERM to exit: a run still busy then exits with code 143, keeping "
        "the previous checkpoint. Keep it under the platform's own grace (Kubernetes' "
        "terminationGracePeriodSeconds, 30 s by default) so the checkpoint is written before SIGKILL.",
    )
    stall_warn_s: float | None = Field(
        default=300.0,
        gt=0,
        description="While rollouts are outstanding, no rollout finishing and no token sampled for this "
        "long is a stall: the console and train.log get a diagnosis (the outstanding rollouts by agent "
        "target with the time since their last model call, the engine's queue and last sampled token, "
        "the learner's state, the likeliest reading), once per stall. Unset: never.",
    )
    stall_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="A stall this long ends it as on_stall_timeout says. Unset: a stall only warns, and "
        "rollout_timeout_s still ends each rollout.",
    )
    on_stall_timeout: Literal["fail_rollouts", "stop_run"] = Field(
        default="fail_rollouts",
        description="What stall_timeout_s does. fail_rollouts: the stalled rollouts at agents fail by "
        "cause `stalled` (counted like other failures; the step goes on with the rest; with none at an "
        "agent, the run stops). stop_run: the run stops with the diagnosis (`rft train` exits 1; "
        "`--resume` continues from the last checkpoint). metrics.jsonl's `stalls` and Prometheus' "
        "rftkit_train_stalls_total record either.",
    )
