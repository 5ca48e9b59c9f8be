"""The trainer's step metrics as Prometheus series, in the policy server's registry.

:class:`StepExporter.publish` takes the record ``MetricsLogger.log_step`` writes to
``metrics.jsonl`` (the one place step records go), so the JSONL, MLflow and ``/metrics`` always agree.
Gauges hold the last step's values; counters add up over the run (rates work across scrapes).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

# Step-time phases of a record's ``time_s``: rollouts (their own wall time, and how long the learner
# waited for them), the optimizer update, serving the new adapter.
PHASES = ("rollout", "rollout_wait", "update", "adapter_load", "step")


class StepExporter:
    """Last-step gauges and run-total counters of the trainer, registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, labels, registry=registry)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, registry=registry)

        self.step = gauge("rftkit_train_step", "The last finished training step.")
        self.reward = gauge("rftkit_train_reward_mean", "Mean reward of the last step's scored rollouts.")
        self.reward_std = gauge("rftkit_train_reward_std", "Reward standard deviation of the last step.")
        self.success = gauge(
            "rftkit_train_success_rate",
            "Share of the last step's scored rollouts with a reward above success_threshold.",
        )
        self.kl = gauge("rftkit_train_kl", "KL to the reference policy (k3, token mean) of the last update.")
        self.mismatch_kl = gauge(
            "rftkit_train_mismatch_kl", "KL between the sampler's and the trainer's logprobs, last update."
        )
        self.clip_fraction = gauge(
            "rftkit_train_clip_fraction", "Share of tokens whose clipped branch was taken, last update."
        )
        self.loss = gauge("rftkit_train_loss", "Loss of the last update.")
        self.fidelity = gauge(
            "rftkit_train_fidelity",
            "The last step's sampler/learner agreement, by figure (the step record's 'fidelity', "
            "docs/fidelity.md): logprob differences, importance ratios, prefix breaks, unparsed and "
            "truncated calls.",
            ("figure",),
        )
        self.step_seconds = gauge(
            "rftkit_train_step_seconds", "Seconds of the last step, by phase.", ("phase",)
        )
        self.staleness = gauge(
            "rftkit_train_staleness",
            "Adapter versions the last step's rollouts lagged the policy they trained (mean, max).",
            ("stat",),
        )
        self.eval_success = gauge("rftkit_eval_success_rate", "Success rate of the last evaluation.")
        self.eval_reward = gauge("rftkit_eval_reward_mean", "Mean reward of the last evaluation.")
        self.cost = gauge("rftkit_train_cost_usd", "Estimated dollars spent by the run so far.")
        self.rollouts = counter(
            "rftkit_train_rollouts", "Training rollouts played, by outcome.", ("outcome",)
        )
        self.failures = counter("rftkit_rollout_failures", "Failed training rollouts by cause.", ("cause",))
        self.trained_tokens = counter("rftkit_trained_tokens", "Tokens the learner trained on.")
        self.groups_dropped = counter(
            "rftkit_train_groups_dropped", "Groups that gave no gradient (too few or equal rewards)."
        )

    def publish(self, step: int, record: dict[str, Any]) -> None:
        """Update the series from one step's record (the shape ``trainer.loop`` logs)."""
        self.step.set(step)
        _set(self.reward, record.get("reward_mean"))
        _set(self.reward_std, record.get("reward_std"))
        _set(self.success, record.get("success_rate"))
        _set(self.cost, record.get("cost_usd_total"))
        update = record.get("update", {})
        for gauge, key in (
            (self.kl, "kl"),
            (self.mismatch_kl, "mismatch_kl"),
            (self.clip_fraction, "clip_fraction"),
            (self.loss, "loss"),
        ):
            _set(gauge, update.get(key))
        for figure, value in record.get("fidelity", {}).items():
            if isinstance(value, int | float):  # not the list naming where calls were cut off
                _set(self.fidelity.labels(figure), value)
        for stat, value in record.get("staleness", {}).items():
            _set(self.staleness.labels(stat), value)
        for phase in PHASES:
            _set(self.step_seconds.labels(phase), record.get("time_s", {}).get(phase))
        rollouts = record.get("rollouts", {})
        self.rollouts.labels("ok").inc(rollouts.get("ok", 0))
        self.rollouts.labels("failed").inc(rollouts.get("failed", 0))
        for cause, count in record.get("failures", {}).items():
            self.failures.labels(cause).inc(count)
        self.trained_tokens.inc(record.get("tokens", {}).get("train", 0))
        self.groups_dropped.inc(record.get("groups", {}).get("dropped", 0))
        evaluation = record.get("eval")
        if evaluation:
            _set(self.eval_success, evaluation.get("success_rate"))
            _set(self.eval_reward, evaluation.get("mean_reward"))


class StallSeries:
    """The stall watchdog's series (trainer.ops.watchdog): the stall under way and the stalls so far."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.seconds = Gauge(
            "rftkit_train_stall_seconds",
            "Seconds no rollout finished and no token was sampled while rollouts are outstanding (0: "
            "progress at the last look).",
            registry=registry,
        )
        self.rollouts = Gauge(
            "rftkit_train_stalled_rollouts", "Rollouts outstanding in that stall.", registry=registry
        )
        self.events = Counter(
            "rftkit_train_stalls",
            "Stalls by what the watchdog did: warned (faults.stall_warn_s), failed_rollouts or stopped_run "
            "(faults.stall_timeout_s).",
            ("action",),
            registry=registry,
        )

    def stalled(self, seconds: float, rollouts: int) -> None:
        self.seconds.set(seconds)
        self.rollouts.set(rollouts)

    def clear(self) -> None:
        self.stalled(0.0, 0)

    def count(self, action: str) -> None:
        self.events.labels(action).inc()


def _set(gauge: Gauge, value: Any) -> None:
    """Set a gauge from a record's number; an absent value leaves it as it was (NaN is kept: no score)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        gauge.set(float(value))
