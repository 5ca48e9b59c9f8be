"""``RayEngine``: inference replicas as Ray actors behind the one gateway, as one :class:`Engine`.

The gateway (``PolicyServer``) stays the single endpoint agents call; this engine holds the replica
actors and

- routes each rollout's calls to one replica (sticky, for its prefix cache) and new rollouts to the
  live replica with the fewest outstanding calls (:class:`~policy_server.engines.ray.routing.StickyRouter`);
- loads an adapter version into every live replica before ``load_adapter`` returns, so the gateway
  makes a version current for new rollouts only once all live replicas hold it;
- fails over: a call whose replica dies is sent again to another live replica (it had not been
  recorded, and its seed makes the retry sample what the first try would have). Ray restarts the
  dead actor (``max_restarts``); it rejoins once it has loaded the adapter versions in use;
- takes images when the replicas' model does (``supports_images``, ``image_token_id``, asked of the
  replicas at start): a call's decoded images travel to its replica inside the request.

Ray is imported here only: a config without a ``ray`` section never imports this module.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import ray
from ray.exceptions import RayActorError, RayTaskError

from policy_server.engines.adapter_files import read_adapter
from policy_server.engines.base import Engine, GenerationRequest, GenerationResult
from policy_server.engines.ray.replica import MissingAdapter, Replica
from policy_server.engines.ray.resources import asked_and_had
from policy_server.engines.ray.routing import NoLiveReplica, StickyRouter

log = logging.getLogger(__name__)

AdapterTransfer = Literal["object_store", "shared_path"]
RECOVERY_POLL_S = 1.0


@dataclass
class ReplicaEvents:
    """What happened to the replicas: the counts a run reports and the tests check."""

    failovers: int = 0  # calls sent again to another replica after theirs died
    deaths: int = 0  # times a replica was seen dead
    recoveries: int = 0  # restarted replicas that rejoined with the adapters in use
    errors: list[str] = field(default_factory=list)  # the text of each death, in order


class RayEngine:
    """``replicas`` actors, each running the engine ``build_engine()`` makes, as one engine."""

    def __init__(
        self,
        build_engine: Callable[[], Engine],
        *,
        model_name: str,
        replicas: int = 2,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        resources: dict[str, float] | None = None,
        max_restarts: int = 3,
        adapter_transfer: AdapterTransfer = "object_store",
        adapter_dtype: str | None = None,
        recovery_timeout_s: float = 300.0,
        name_prefix: str | None = None,
        start_timeout: tuple[float, str] | None = None,
    ) -> None:
        """``name_prefix``: the actors are named ``{name_prefix}-replica-{i}`` (``ray list actors``
        shows them; ``ray.get_actor`` finds them), unnamed without it. ``adapter_dtype``: the dtype
        the replicas' engines serve adapters in; adapters put into the object store are cast to it.
        ``start_timeout``: how long the first start may take and the setting that says so (a vLLM
        that compiles and captures graphs takes longer than a restart's model load); unset:
        ``recovery_timeout_s``."""
        self.model_name = model_name
        self.name_prefix = name_prefix
        self._build_engine = build_engine
        self._options: dict[str, Any] = {
            "num_cpus": num_cpus,
            "num_gpus": num_gpus,
            "resources": dict(resources or {}),
            "max_restarts": max_restarts,
        }
        self.replica_count = replicas
        self.adapter_transfer, self.adapter_dtype = adapter_transfer, adapter_dtype
        self.recovery_timeout_s = recovery_timeout_s
        self.start_timeout = start_timeout or (recovery_timeout_s, "ray.recovery_timeout_s")
        self.router = StickyRouter(replicas)
        self.events = ReplicaEvents()
        self.replicas: list[Any] = []  # Ray actor handles
        self.live: set[int] = set()
        # The adapter versions in use and where each comes from (kept so a restarted replica can
        # load them): a directory path, or the object-store reference of its files.
        self._adapters: dict[int, Any] = {}
        self._recovering: dict[int, asyncio.Task[None]] = {}
        self._rejoined = asyncio.Event()
        # The placeholder token of an image in the prompt ids the replicas return (None: text-only);
        # the gateway finds each image's span with it. Asked of the replicas at start.
        self.image_token_id: int | None = None

    async def start(self) -> None:
        """Create the replica actors and wait until every engine has started."""
        actor_class = ray.remote(Replica)
        self.replicas = [
            actor_class.options(**self._options, **self._name(index)).remote(self._build_engine)
            for index in range(self.replica_count)
        ]
        timeout_s, setting = self.start_timeout
        try:
            # A replica whose resources the cluster cannot give stays pending forever: bound the wait.
            await asyncio.wait_for(
                asyncio.gather(*(replica.ready.remote() for replica in self.replicas)), timeout=timeout_s
            )
        except TimeoutError:
            options = self._options
            asked = {"CPU": options["num_cpus"], "GPU": options["num_gpus"], **options["resources"]}
            each, has = asked_and_had(asked, ray.cluster_resources())
            raise RuntimeError(
                f"the {self.replica_count} inference replicas did not all start within {timeout_s:g} s "
                f"({setting}): each asks for {each}; the cluster has {has} in all (`ray status` shows "
                "what is free): lower ray.inference_replicas or what each asks for, or raise "
                f"{setting} if the engine needs longer to start"
            ) from None
        self.live = set(range(self.replica_count))
        tokens = await asyncio.gather(*(replica.image_token_id.remote() for replica in self.replicas))
        self.image_token_id = agreed_image_token(tokens)

    @property
    def supports_images(self) -> bool:
        """Whether the replicas' model takes images (a vision-language model; known once started)."""
        return self.image_token_id is not None

    def _name(self, index: int) -> dict[str, str]:
        return {"name": f"{self.name_prefix}-replica-{index}"} if self.name_prefix else {}

    async def close(self) -> None:
        for task in self._recovering.values():
            task.cancel()
        for replica in self.replicas:
            try:
                await replica.close.remote()
            except RayActorError:
                pass  # dead already: nothing to close
            ray.kill(replica, no_restart=True)
        self.replicas, self.live = [], set()

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Sample on the rollout's replica; if that replica dies, again on another live one."""
        while True:
            index = await self._route(request.rollout_id)
            self.router.begin(index)
            try:
                return await self.replicas[index].generate.remote(request)
            except RayActorError as error:
                self._lost(index, error)
                self.events.failovers += 1
            except RayTaskError as error:
                if not isinstance(error.cause, MissingAdapter):
                    raise _unwrapped(error) from None
                # Restarted since the version was loaded: load what it lacks, then try again.
                await self._load_into(index, request.adapter_version)
            finally:
                self.router.end(index)

    async def load_adapter(self, version: int, path: str) -> None:
        """Load ``version`` into every live replica; returns when all of them hold it."""
        if self.adapter_transfer == "object_store":
            # Reading and putting a large adapter takes a while: off the gateway's event loop.
            self._adapters[version] = await asyncio.to_thread(
                lambda: ray.put(read_adapter(path, self.adapter_dtype))
            )
        else:
            if not (Path(path) / "adapter_config.json").is_file():
                raise ValueError(f"{path} is not a peft adapter directory (no adapter_config.json in it)")
            self._adapters[version] = path
        try:
            await asyncio.gather(*(self._load_into(index, version) for index in sorted(self.live)))
        except BaseException:
            del self._adapters[version]
            raise

    async def unload_adapter(self, version: int) -> None:
        self._adapters.pop(version, None)
        for index in sorted(self.live):
            try:
                await self.replicas[index].unload_adapter.remote(version)
            except RayActorError as error:
                self._lost(index, error)

    def replica_stats(self) -> dict[str, Any]:
        """Live replicas, calls routed to each, outstanding calls, and the fault counts."""
        return {
            "live": sorted(self.live),
            "calls": list(self.router.calls),
            "moved_rollouts": self.router.moved,
            "outstanding": list(self.router.outstanding),
            **{key: value for key, value in vars(self.events).items() if key != "errors"},
        }

    # ---- replicas that die and come back ---------------------------------------------------------

    async def _route(self, rollout_id: str | None) -> int:
        """A live replica for the call; with none live, wait for a restarted one to rejoin."""
        deadline = time.monotonic() + self.recovery_timeout_s
        while True:
            try:
                return self.router.route(rollout_id, self.live)
            except NoLiveReplica:
                if not self._recovering or time.monotonic() > deadline:
                    raise NoLiveReplica(
                        f"no inference replica is live and none came back within "
                        f"{self.recovery_timeout_s:g} s; the last death: "
                        f"{self.events.errors[-1] if self.events.errors else 'unknown'}"
                    ) from None
                self._rejoined.clear()
                try:
                    await asyncio.wait_for(self._rejoined.wait(), RECOVERY_POLL_S)
                except TimeoutError:
                    pass

    async def _load_into(self, index: int, version: int) -> None:
        source = self._adapters.get(version)
        if source is None:
            raise RuntimeError(f"adapter version {version} is no longer served (unloaded)")
        try:
            await self.replicas[index].load_adapter.remote(version, source)
        except RayActorError as error:
            self._lost(index, error)  # the replica loads it when it rejoins
        except RayTaskError as error:
            raise _unwrapped(error) from None

    def _lost(self, index: int, error: BaseException) -> None:
        """Take a dead replica out of routing and watch for Ray to bring it back."""
        if index not in self.live:
            return
        self.live.discard(index)
        self.events.deaths += 1
        self.events.errors.append(f"replica {index}: {type(error).__name__}: {_first_line(error)}")
        log.warning("inference replica %d died (%s); its calls fail over", index, _first_line(error))
        if index not in self._recovering:
            self._recovering[index] = asyncio.get_running_loop().create_task(self._recover(index))

    async def _recover(self, index: int) -> None:
        """Wait for the restarted actor, load the adapter versions in use, then route to it again."""
        deadline = time.monotonic() + self.recovery_timeout_s
        try:
            while time.monotonic() < deadline:
                try:
                    await asyncio.wait_for(
                        asyncio.wrap_future(self.replicas[index].ready.remote().future()),
                        timeout=max(1.0, deadline - time.monotonic()),
                    )
                    for version in sorted(self._adapters):
                        await self.replicas[index].load_adapter.remote(version, self._adapters[version])
                except (RayActorError, TimeoutError) as error:
                    log.info("replica %d not back yet: %s", index, _first_line(error))
                    await asyncio.sleep(RECOVERY_POLL_S)
                    continue
                self.live.add(index)
                self.events.recoveries += 1
                self._rejoined.set()
                log.warning("inference replica %d is back with adapters %s", index, sorted(self._adapters))
                return
            log.error("inference replica %d did not come back within %g s", index, self.recovery_timeout_s)
        finally:
            self._recovering.pop(index, None)


def agreed_image_token(tokens: list[int | None]) -> int | None:
    """The image placeholder token every replica names; replicas that disagree serve different
    models, which one gateway cannot record faithfully."""
    if len(set(tokens)) > 1:
        raise RuntimeError(
            f"the inference replicas name different image placeholder tokens ({tokens}): they serve "
            "different models; give every replica the same model directory"
        )
    return tokens[0] if tokens else None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _unwrapped(error: RayTaskError) -> Exception:
    """The replica's own exception, so the gateway answers a ValueError with a 4xx, the rest 5xx."""
    cause = error.cause
    if isinstance(cause, ValueError):
        return ValueError(str(cause))
    return RuntimeError(f"{type(cause).__name__}: {_first_line(cause)}" if cause else _first_line(error))
