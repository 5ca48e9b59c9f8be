"""A run's policy server and rollout producer (:class:`Session`), and the engine it serves with.

The policy server (gateway + inference engine) runs in a background thread of this process; the
learner stays in the main thread. With the ``vllm`` engine, inference lives in the vLLM server process.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

from handlers import InferenceParams, RftkitExtras, ServingThread
from policy_server import ImageStore, PolicyServer, Rejection, TokenCounters
from policy_server.engines import Engine
from policy_server.http import SageMakerTokenPolicy, start_metrics_server
from policy_server.workers import serve_gateway
from trainer.config import PolicyServerConfig, TrainConfig
from trainer.engine import local_engine
from trainer.rollouts.dataset import dataset_row_name, derived_seed
from trainer.rollouts.fanout import Fanout, RolloutRequest
from trainer.rollouts.producer import PlayedRollout, RolloutProducer
from trainer.scale.placement import Placement

log = logging.getLogger(__name__)


def build_engine(config: TrainConfig, model_dir: Path, placement: Placement) -> Engine:
    """The run's engine: replicas on Ray when the config has a ray section, else a local one."""
    if config.ray is not None:
        from trainer.scale.ray_cluster import ray_engine

        # Named after the run, so `ray list actors` shows whose replicas these are.
        return ray_engine(
            config, model_dir, name_prefix=f"rftkit-{config.output_dir.name}-{uuid.uuid4().hex[:8]}"
        )
    return local_engine(config, model_dir, placement)


def sagemaker_token_policy(config: PolicyServerConfig) -> SageMakerTokenPolicy | None:
    """The gateway's SageMaker-token policy, when the config accepts such tokens."""
    if not config.accept_sagemaker_tokens:
        return None
    return SageMakerTokenPolicy(access_key_ids=frozenset(config.sagemaker_access_key_ids))


class Session:
    """The policy server, the fan-out and one job: plays rollouts and hands back their traces."""

    def __init__(self, config: TrainConfig, engine: Engine, images: ImageStore | None = None) -> None:
        self.config = config
        # Drawn once per run and handed to its agents in their payloads; logged only by its start.
        api_key = config.policy_server.agents_key()
        self.server = PolicyServer(
            engine,
            policy_name=config.policy_name,
            api_key=api_key,
            sagemaker_tokens=sagemaker_token_policy(config.policy_server),
            allow_unauthenticated_network=config.policy_server.allow_unauthenticated_network,
            image_limits=config.policy_server.image_limits(),
            image_store=images,
        )
        self.thread = serve_gateway(
            self.server,
            config.policy_server.host,
            config.policy_server.port,
            workers=config.policy_server.gateway_workers,
        )
        self.job_arn = f"rftkit-{config.output_dir.name}-{uuid.uuid4().hex[:12]}"
        # Rollouts play on their own event loop, so they can run while the learner trains.
        self.producer = RolloutProducer(
            self.server, Fanout.from_config(config), self.job_arn, config.reward_aggregation
        )
        # What agents get: the agents' key only. The trainer's own operations (jobs, traces,
        # adapters) are method calls on self.server, never served to agents over HTTP.
        self.extras = RftkitExtras(
            model=config.policy_name,
            api_key=api_key,
            timeout_s=config.rollout_timeout_s,
        )
        self.endpoint = ""
        # Tokens of the evaluations since the last step (what asynchronous steps count them from).
        self.eval_tokens = TokenCounters()
        self.metrics_thread: ServingThread | None = None

    def start(self) -> None:
        self.thread.start()
        self.producer.start()
        settings = self.config.policy_server
        if settings.metrics_port is not None:
            self.metrics_thread = start_metrics_server(
                self.server.metrics, settings.host, settings.metrics_port
            )
            log.info("Prometheus metrics at %s/metrics", self.metrics_thread.url)
        self.endpoint = self.config.policy_server.public_url or self.thread.url
        log.info("policy server at %s; agents' credential: %s", self.endpoint, self._credential())
        self.server.open_job(
            self.job_arn,
            max_tokens=self.config.max_completion_length,
            max_calls_per_rollout=self.config.max_calls_per_rollout,
            reasoning_effort=self.config.reasoning_effort,
        )

    def _credential(self) -> str:
        key, settings = self.server.api_key, self.config.policy_server
        if key is None:
            return "none (policy_server.api_key: none)"
        # A prefix tells runs apart in the log without handing the key to whoever reads it.
        drawn = "policy_server.api_key"
        if settings.api_key is None:
            drawn = f"a fresh key for this run ({key[:8]}...)"
        return drawn + (" or a SageMaker token" if settings.accept_sagemaker_tokens else "")

    def close(self) -> None:
        """Close the job (if open), the fan-out and the server."""
        if self.endpoint:
            try:
                self.server.close_job(self.job_arn)
            except Rejection as rejection:  # closed already: nothing is lost, and close() must finish
                log.warning("closing job %s: %s", self.job_arn, rejection.message)
        try:
            self.producer.close()
        finally:
            if self.metrics_thread is not None:
                self.metrics_thread.stop()
            self.thread.stop()

    def request(
        self,
        row: Any,
        rollout_id: str,
        group_index: int,
        *,
        temperature: float,
        seed: int,
        row_name: str | None = None,
        row_index: int | None = None,
    ) -> RolloutRequest:
        params = InferenceParams(
            temperature=temperature,
            max_tokens=self.config.max_completion_length,
            top_p=self.config.top_p,
            seed=seed,
        )
        return RolloutRequest(
            row=row,
            rollout_id=rollout_id,
            group_index=group_index,
            job_arn=self.job_arn,
            endpoint=self.endpoint,
            inference_params=params,
            extras=self.extras,
            row_name=row_name,
            row_index=row_index,
        )

    def play(self, requests: list[RolloutRequest]) -> list[PlayedRollout]:
        """Register, dispatch and collect ``requests``; rewards from the answer or from update-reward."""
        return self.producer.play(requests)

    def count_eval_tokens(self, played: list[PlayedRollout]) -> None:
        """Add evaluation rollouts' tokens to ``eval_tokens``."""
        calls = [call for rollout in played for call in rollout.trace.calls]
        self.eval_tokens.prefill_tokens += sum(len(call.prompt_token_ids) for call in calls)
        self.eval_tokens.sample_tokens += sum(len(call.completion_token_ids) for call in calls)

    def release(self, played: list[PlayedRollout]) -> None:
        """Done with these rollouts' traces: their images leave the run's image store."""
        for rollout in played:
            self.server.release_trace(rollout.trace)

    def load_adapter(self, directory: Path, version: int) -> int:
        """Serve ``directory`` as the trainer's adapter ``version`` (the server's number too)."""
        return self.thread.run(self.server.load_adapter(directory, version))

    def train_requests(self, step: int, picked: list[tuple[int, Any]]) -> list[RolloutRequest]:
        """G rollouts per (row index, row), each with a fresh id and its own sampling seed."""
        config = self.config
        return [
            self.request(
                row,
                f"s{step}-g{group}-{member}-{uuid.uuid4().hex[:8]}",
                group,
                temperature=config.temperature,
                seed=derived_seed(config.seed, "train", step, group, member),
                row_name=dataset_row_name(config.train_file, index),
                row_index=index,
            )
            for group, (index, row) in enumerate(picked)
            for member in range(config.num_generations)
        ]
