"""``PolicyServer``: the policy server's Python API (what the trainer calls) and its ASGI app.

Every chat call runs through :meth:`PolicyServer.complete`: admitted into its rollout within the job's
caps, sampled by the current adapter version, recorded token for token in the rollout's trace.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from functools import cached_property
from pathlib import Path

from starlette.applications import Starlette

from handlers import RolloutStatus, SageMakerTokenPolicy
from policy_server.adapter_versions import AdapterVersions
from policy_server.engines.base import Engine, GenerationRequest, GenerationResult
from policy_server.errors import EngineError, Rejection
from policy_server.http.app import build_app
from policy_server.http.chat_api import ChatCompletionRequest, generation_request, has_images
from policy_server.http.images import (
    ImageError,
    ImageInput,
    ImageLimits,
    ImageRef,
    locate_images,
    request_images,
)
from policy_server.http.metrics import RequestMetricsMiddleware, ServerMetrics
from policy_server.image_store import ImageStore, trace_key
from policy_server.jobs import JobLimits, JobRegistry
from policy_server.models.families import Family, UnknownFamilyError, family_of
from policy_server.recording import call_record
from policy_server.trace import RolloutTrace, TokenCounters

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


def call_seed(rollout_seed: int, call_number: int) -> int:
    """The sampling seed of a rollout's ``call_number``-th call (0-based), from the seed its calls carry.

    An agent passes its rollout's one seed on every call. Used as is, every call would replay the same
    random stream, so the same token position (a maze move's direction, say) would draw the same
    uniform number at every turn: episodes far less random than the policy. Mixing in the call's
    position keeps a rollout reproducible (its n-th call always samples the same way) while its
    calls draw independently. 63 bits, within every engine's seed range.
    """
    digest = hashlib.blake2b(f"{rollout_seed}:{call_number}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


class PolicyServer:
    """The policy endpoint: an engine behind the gateway, the job registry and adapter versions."""

    def __init__(
        self,
        engine: Engine,
        policy_name: str = "policy",
        api_key: str | None = None,
        *,
        admin_key: str | None = None,
        adapters_dir: str | Path | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        sagemaker_tokens: SageMakerTokenPolicy | None = None,
        image_limits: ImageLimits | None = None,
        image_store: ImageStore | None = None,
        inference_max_tokens: int | None = None,
        allow_unauthenticated_network: bool = False,
    ) -> None:
        """``api_key`` guards what agents call; ``admin_key``, when given, serves ``/admin/*`` over
        HTTP to its holder (never to an agent's key); ``adapters_dir`` is the only directory
        ``/admin/load-adapter`` loads from. The Python API below is the trainer's and takes any path.
        ``image_limits``: what a call's images may be; ``image_store``: where the images of recorded
        calls are kept, content-addressed, until their traces are released (unset: a store in a
        temporary directory, removed with the server). ``inference_max_tokens``, when given, makes it a
        plain inference server (``rft serve --inference``): chat calls need no job headers, are capped
        at that many tokens, and nothing of them is kept (:meth:`infer`).
        ``allow_unauthenticated_network``: serve a non-loopback address with no credential check
        (refused otherwise: :func:`policy_server.running.exposure_refusal`).
        """
        if admin_key and admin_key == api_key:
            raise ValueError("The admin key must differ from the agents' API key: agents hold theirs.")
        self.engine = engine
        self.policy_name = policy_name
        self.api_key = api_key or None
        self.admin_key = admin_key or None
        self.adapters_dir = Path(adapters_dir).resolve() if adapters_dir is not None else None
        # Accept the SageMaker SDK's signed bearer tokens on the agents' routes (checked offline).
        self.sagemaker_tokens = sagemaker_tokens
        self.allow_unauthenticated_network = allow_unauthenticated_network
        self.max_body_bytes = max_body_bytes
        self.image_limits = image_limits or ImageLimits()
        self.image_store = image_store if image_store is not None else ImageStore.temporary()
        self.inference_max_tokens = inference_max_tokens
        self.registry = JobRegistry()
        self._versions = AdapterVersions()
        self._adapter_lock: asyncio.Lock | None = None
        self.metrics = ServerMetrics()
        self.metrics.watch(self)

    @cached_property
    def app(self) -> Starlette:
        """The Starlette ASGI app serving this server's routes."""
        app = build_app(self)
        routes = [getattr(route, "path", "") for route in app.routes]
        # Outermost, so refusals of the other middleware (a wrong API key) are counted too.
        app.add_middleware(RequestMetricsMiddleware, metrics=self.metrics, routes=routes)
        return app

    @property
    def model_names(self) -> tuple[str, str]:
        """Names a request's ``model`` may use: the policy's own, or ``default`` (AWS's samples)."""
        return (self.policy_name, "default")

    async def start(self) -> None:
        """Start the engine on the current event loop (the loop that will serve requests)."""
        await self.engine.start()

    async def close(self) -> None:
        await self.engine.close()

    # Jobs and rollouts: plain methods, callable from any thread.

    def open_job(
        self,
        job_arn: str,
        max_tokens: int = 1024,
        max_calls_per_rollout: int = 64,
        auto_open_rollouts: bool = False,
        max_open_rollouts: int = 1024,
        reasoning_effort: str | None = None,
    ) -> None:
        """Open a job; ``reasoning_effort`` is given to each of its calls that sends none."""
        limits = JobLimits(
            max_tokens,
            max_calls_per_rollout,
            auto_open_rollouts,
            max_open_rollouts,
            reasoning_effort=reasoning_effort,
        )
        self.registry.open_job(job_arn, limits)

    def close_job(self, job_arn: str) -> TokenCounters:
        self._versions.unpin_job(job_arn)
        return self.registry.close_job(job_arn)

    def open_rollout(self, job_arn: str, rollout_id: str, adapter_version: int | None = None) -> None:
        """Open a rollout; with ``adapter_version`` (a loaded version, 0 the base model), all its calls
        sample on that version, which stays loaded until the rollout's trace is taken, however many
        versions are loaded meanwhile (asynchronous training: a rollout ends on the policy it began
        with). Without it, each call samples on the version current when it arrives."""
        self.registry.open_rollout(job_arn, rollout_id)
        if adapter_version is None:
            return
        try:
            self._versions.pin((job_arn, rollout_id), adapter_version)
        except ValueError:  # a version not loaded: the rollout must not stay open on another one
            self.registry.take_trace(job_arn, rollout_id)
            raise

    def take_trace(self, job_arn: str, rollout_id: str) -> RolloutTrace:
        """The finished rollout's trace (taken once); its version pin, if any, is released. Its images
        stay in ``image_store`` until :meth:`release_trace`."""
        try:
            return self.registry.take_trace(job_arn, rollout_id)
        finally:
            self._versions.unpin((job_arn, rollout_id))

    def release_trace(self, trace: RolloutTrace) -> None:
        """Done with ``trace``: delete the stored images no other trace still references."""
        self.image_store.release(trace_key(trace.job_arn, trace.rollout_id))

    def counters(self, job_arn: str) -> TokenCounters:
        return self.registry.counters(job_arn)

    def complete_rollout(self, job_arn: str, rollout_id: str, status: RolloutStatus) -> None:
        self.registry.complete_rollout(job_arn, rollout_id, status)
        self.metrics.rollouts_reported.labels(str(status)).inc()

    def update_reward(self, job_arn: str, rollout_id: str, rewards: list[float]) -> None:
        self.registry.update_reward(job_arn, rollout_id, rewards)

    # Adapter versions: coroutines, run on the server's event loop.

    @property
    def current_adapter_version(self) -> int:
        return self._versions.current

    @property
    def pinned_adapter_versions(self) -> tuple[int, ...]:
        """Versions some open rollout is pinned to (they stay loaded until those rollouts end)."""
        return self._versions.pinned_versions()

    @property
    def loaded_adapter_versions(self) -> tuple[int, ...]:
        """Adapter versions the engine holds now (the current one plus any still used by calls)."""
        return tuple(sorted(self._versions.loaded))

    def admitted_adapter_path(self, path: str) -> Path:
        """``path`` resolved inside ``adapters_dir``, or the Rejection an HTTP load-adapter gets."""
        if self.adapters_dir is None:
            raise Rejection(
                403,
                "This server was given no adapters directory, so it loads no adapter over HTTP; "
                "start `rft serve` with --adapters-dir.",
            )
        try:
            directory = (self.adapters_dir / path).resolve()
        except (OSError, ValueError) as error:
            raise Rejection(400, f"The adapter path cannot be used: {error}.") from None
        if not directory.is_relative_to(self.adapters_dir):
            raise Rejection(
                403, f"Adapters load only from inside {self.adapters_dir}; the path leads outside it."
            )
        return directory

    async def load_adapter(self, path: str | Path, version: int | None = None) -> int:
        """Load a LoRA adapter directory as the next version; new calls use it from now on.

        ``version``: the number to serve it as (the trainer's own, so a resumed run's log and traces
        name one number per adapter); it must be above every number issued so far.
        """
        directory = Path(path)
        try:
            is_adapter = (directory / "adapter_config.json").is_file()
        except (OSError, ValueError):  # a name too long for the filesystem, a NUL byte
            is_adapter = False
        if not is_adapter:
            raise ValueError(
                f"The path {directory} is not a peft adapter directory (it has no adapter_config.json)."
            )
        if self._adapter_lock is None:
            self._adapter_lock = asyncio.Lock()
        async with self._adapter_lock:
            if version is not None and version <= self._versions.last_issued:
                raise ValueError(
                    f"adapter version {version} cannot be served: version {self._versions.last_issued} "
                    "was already issued, and a version never names two sets of weights"
                )
            # The number is spent even if loading fails, so a version never names two sets of weights.
            self._versions.last_issued = version or self._versions.last_issued + 1
            version = self._versions.last_issued
            await self.engine.load_adapter(version, str(directory))
            self._versions.loaded.add(version)
            self._versions.current = version
            await self._unload_retired()
        return version

    def acquire_adapter_version(self, job_arn: str, rollout_id: str) -> int:
        """The version a call of this rollout samples on (its pinned one, else the current one), held
        until :meth:`release_adapter_version`: for calls served in other processes (gateway workers),
        so a version they still use is never unloaded under them."""
        return self._versions.acquire((job_arn, rollout_id))

    async def release_adapter_version(self, version: int) -> None:
        """End one hold of :meth:`acquire_adapter_version`; unload the version if it is retired now."""
        self._versions.release(version)
        if version != self._versions.current:
            await self._unload_retired()

    async def _unload_retired(self) -> None:
        for version in self._versions.retired():
            if version not in self._versions.loaded:  # another call retired it while we awaited
                continue
            self._versions.loaded.discard(version)
            try:
                await self.engine.unload_adapter(version)
            except Exception:  # a leftover adapter costs memory only; calls must not fail for it
                logger.exception("could not unload adapter version %d", version)

    # Calls.

    async def complete(
        self, job_arn: str, rollout_id: str, request: ChatCompletionRequest
    ) -> GenerationResult:
        """Sample one chat call for a rollout and record it; raises Rejection (4xx) or EngineError (5xx)."""
        started_at = time.time()
        limits = self.registry.limits(job_arn)
        self.registry.check_rollout(job_arn, rollout_id)
        generation = self._admissible(request, limits.max_tokens, limits.reasoning_effort)
        # Only a valid request opens a rollout of an auto-opening job (start_call does).
        ticket = self.registry.start_call(job_arn, rollout_id)
        if generation.seed is not None:
            generation.seed = call_seed(generation.seed, ticket.call_number)
        version = self._versions.acquire((job_arn, rollout_id))
        generation.adapter_version = version
        generation.rollout_id = rollout_id
        result = await self._generate(generation, version)
        self.metrics.record_call(len(result.prompt_token_ids), len(result.completion_token_ids))
        images = self._store_images(job_arn, rollout_id, generation.images, result.prompt_token_ids)
        record = call_record(
            generation,
            result,
            index=ticket.sequence,
            adapter_version=version,
            started_at=started_at,
            finished_at=time.time(),
            images=images,
        )
        self.registry.record_call(ticket, record)
        return result

    async def infer(self, request: ChatCompletionRequest) -> GenerationResult:
        """Sample one chat call outside any job (an inference server): on the current adapter version,
        with the call's own seed, and nothing recorded, so calls never run into a job's caps."""
        if self.inference_max_tokens is None:
            raise Rejection(400, "This server serves calls of open jobs only; send the job headers.")
        generation = self._admissible(request, self.inference_max_tokens)
        version = self._versions.acquire(("", ""))  # no rollout is pinned under the empty key
        generation.adapter_version = version
        result = await self._generate(generation, version)
        self.metrics.record_call(len(result.prompt_token_ids), len(result.completion_token_ids))
        return result

    def _admissible(
        self, request: ChatCompletionRequest, max_tokens: int, reasoning_effort: str | None = None
    ) -> GenerationRequest:
        """The engine's request for a call this server accepts (images decoded), with
        ``reasoning_effort`` (the job's) where it sends none; a Rejection otherwise."""
        if request.model not in self.model_names:
            raise Rejection(
                404, f"Model {request.model!r} is not served here; use {self.policy_name!r} or 'default'."
            )
        if has_images(request) and not getattr(self.engine, "supports_images", False):
            raise Rejection(
                400, "This policy's model is text-only and takes no image inputs; send text content only."
            )
        generation = generation_request(request, max_tokens_cap=max_tokens)
        effort = generation.reasoning_effort or generation.chat_template_kwargs.get("reasoning_effort")
        if effort is None:
            effort = generation.reasoning_effort = reasoning_effort
        if effort is not None and self._family is not None:
            refusal = self._family.reasoning_effort_refusal(effort)
            if refusal is not None:
                raise Rejection(400, refusal)
        try:
            generation.images = request_images(generation.messages, self.image_limits)
        except ImageError as error:
            raise Rejection(400, str(error)) from None
        return generation

    @cached_property
    def _family(self) -> Family | None:
        """The served model's family, when the engine names a model directory of a known one."""
        model_dir = getattr(self.engine, "model_dir", None)
        if model_dir is None:
            return None
        try:
            return family_of(model_dir)
        except UnknownFamilyError:  # a hub id, or a directory without config.json: the engine's to judge
            return None

    async def _generate(self, generation: GenerationRequest, version: int) -> GenerationResult:
        """The engine's answer; its refusals become 400s, its failures 500s; the version is released."""
        self.metrics.calls_in_flight.inc()
        try:
            return await self.engine.generate(generation)
        except ValueError as error:
            # Engines raise ValueError for requests they cannot serve (a template that cannot render
            # the messages, a prompt filling the context): the caller's to fix, so a 4xx.
            raise Rejection(400, f"The engine refused this request: {str(error).rstrip('.')}.") from error
        except Exception as error:
            logger.exception("engine failed on a call of rollout %s", generation.rollout_id)
            raise EngineError(f"The engine failed on this call: {type(error).__name__}: {error}") from error
        finally:
            self.metrics.calls_in_flight.dec()
            self._versions.release(version)
            if version != self._versions.current:
                await self._unload_retired()

    def _store_images(
        self, job_arn: str, rollout_id: str, images: list[ImageInput], prompt_ids: list[int]
    ) -> list[ImageRef]:
        """Each image's place in the prompt; the bytes go to the store once per distinct image."""
        if not images:
            return []
        image_token_id = getattr(self.engine, "image_token_id", None)
        if image_token_id is None:
            raise EngineError("The engine took images but names no image placeholder token (image_token_id).")
        try:
            refs = locate_images(prompt_ids, image_token_id, images)
        except ValueError as error:
            raise EngineError(f"The engine's prompt does not carry this call's images: {error}.") from error
        key = trace_key(job_arn, rollout_id)
        for image in images:
            self.image_store.put(image, key)
        return refs
