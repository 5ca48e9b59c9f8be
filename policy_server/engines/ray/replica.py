"""One inference replica: the body of a Ray actor that runs an engine (hf or vLLM) in its process.

Ray restarts a dead replica by running its constructor again, so the constructor only records how
to build the engine; the engine starts on the first call (``ready``), and the replica starts with no
adapter: :class:`~policy_server.engines.ray.engine.RayEngine` loads the versions in use before it
routes calls to it again, and a call for a version the replica lacks raises :class:`MissingAdapter`
(never a silent fall-back to another version).
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from policy_server.engines.adapter_files import AdapterFiles, write_adapter
from policy_server.engines.base import Engine, GenerationRequest, GenerationResult


class MissingAdapter(LookupError):
    """This replica does not hold the adapter version a call asked for (it restarted since)."""

    def __init__(self, version: int) -> None:
        super().__init__(f"adapter version {version} is not loaded on this replica")
        self.version = version


class Replica:
    """An engine in a Ray actor; every method is a coroutine on the actor's event loop."""

    def __init__(self, build_engine: Callable[[], Engine]) -> None:
        self._build_engine = build_engine
        self._engine: Engine | None = None
        self._starting = asyncio.Lock()
        self.incarnation = uuid.uuid4().hex  # a restart runs the constructor again: a new value
        self._adapters: set[int] = set()

    async def ready(self) -> str:
        """Start the engine if it is not running; this incarnation's id."""
        async with self._starting:
            if self._engine is None:
                engine = self._build_engine()
                await engine.start()
                self._engine = engine
        return self.incarnation

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        engine = await self._running()
        if request.adapter_version != 0 and request.adapter_version not in self._adapters:
            raise MissingAdapter(request.adapter_version)
        return await engine.generate(request)

    async def load_adapter(self, version: int, source: str | AdapterFiles) -> None:
        """Load ``version`` from a directory every node sees, or from its files (the object store)."""
        engine = await self._running()
        if version in self._adapters:
            return
        if isinstance(source, str):
            if not (Path(source) / "adapter_config.json").is_file():
                raise ValueError(
                    f"the adapter directory {source} is not visible on this replica's node "
                    f"({socket.gethostname()}): with ray.adapter_transfer 'shared_path' every node must "
                    "mount the run directory; use 'object_store' otherwise"
                )
            await engine.load_adapter(version, source)
        else:
            # The engine reads the files while loading and keeps the weights in memory: the copy on
            # this node's disk is needed only until then.
            directory = Path(tempfile.mkdtemp(prefix=f"rftkit-adapter-v{version}-"))
            try:
                write_adapter(source, directory)
                await engine.load_adapter(version, str(directory))
            finally:
                shutil.rmtree(directory, ignore_errors=True)
        self._adapters.add(version)

    async def unload_adapter(self, version: int) -> None:
        if version not in self._adapters:
            return
        self._adapters.discard(version)
        await (await self._running()).unload_adapter(version)

    async def image_token_id(self) -> int | None:
        """The engine's image placeholder token, None for a text-only model (the gateway asks the
        :class:`~policy_server.engines.ray.engine.RayEngine`, which asks its replicas)."""
        engine = await self._running()
        return getattr(engine, "image_token_id", None) if getattr(engine, "supports_images", False) else None

    async def loaded_adapters(self) -> list[int]:
        return sorted(self._adapters)

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.close()
            self._engine = None

    async def _running(self) -> Engine:
        await self.ready()
        assert self._engine is not None
        return self._engine
