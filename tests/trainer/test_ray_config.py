"""The ``ray`` config section: what it accepts and refuses, that Ray stays unimported without it, and
that the KubeRay deployment's files agree with it."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainer.config import ConfigError, TrainConfig, load_config, validate_config
from trainer.scale.ray_cluster import adapter_serving_dtype

REPO = Path(__file__).resolve().parents[2]
BASE = {"train_file": "train.jsonl"}


def test_defaults_and_addresses() -> None:
    assert validate_config(BASE).ray is None
    settings = validate_config({**BASE, "ray": {}}).ray
    assert settings is not None
    assert (settings.address, settings.inference_replicas, settings.learner_workers) == ("local", 2, 1)
    for address in ("auto", "ray://head:10001"):
        assert validate_config({**BASE, "ray": {"address": address}}).ray.address == address  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"ray": {"address": "head:6379"}}, "address must be 'local', 'auto' or a ray://host:port"),
        ({"ray": {"inference_replicas": 0}}, "ray.inference_replicas"),
        ({"ray": {"inference_replica": 2}}, "did you mean 'inference_replicas'?"),
        ({"ray": {}, "engine": "vllm", "vllm": {"attach_url": "http://x:8000"}}, "unset attach_url"),
        ({"ray": {}, "vllm": {"enable_sleep_mode": True}}, "unset enable_sleep_mode"),
        ({"ray": {}, "vllm": {"devices": [0]}}, "unset devices"),
    ],
)
def test_refusals_name_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("?", r"\?")):
        validate_config({**BASE, **fields})


def _top_level_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:  # module level only: imports inside functions are lazy
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_ray_is_imported_only_by_the_modules_a_ray_section_reaches() -> None:
    # Ray is an optional extra: importing the packages (as a run without a ray section does) must
    # not import it. Only the replicated engine imports it at module level, and nothing imports that
    # engine, or the trainer's Ray module, at module level.
    lazy = {
        "ray",
        "policy_server.engines.ray.engine",
        "trainer.scale.ray_cluster",
        "trainer.learner.distributed",
    }
    importers = {
        path.relative_to(REPO).as_posix(): sorted(
            name for name in _top_level_imports(path) if name.split(".")[0] == "ray" or name in lazy
        )
        for package in ("handlers", "policy_server", "trainer")
        for path in (REPO / package).rglob("*.py")
    }
    assert {path: names for path, names in importers.items() if names} == {
        "policy_server/engines/ray/engine.py": ["ray", "ray.exceptions"]
    }


def test_kuberay_files_agree_with_the_config() -> None:
    config = load_config(REPO / "deploy" / "kuberay" / "train.yaml")
    assert config.ray is not None and config.ray.address == "auto"
    documents = list(yaml.safe_load_all((REPO / "deploy" / "kuberay" / "raycluster.yaml").read_text()))
    (cluster,) = [doc for doc in documents if doc["kind"] == "RayCluster"]
    groups = {group["groupName"]: group for group in cluster["spec"]["workerGroupSpecs"]}
    # The replicas' custom resource is what the inference pods advertise, once per pod.
    advertised = json.loads(json.loads(groups["inference"]["rayStartParams"]["resources"]))
    assert advertised == config.ray.replica_resources == {"inference": 1}
    assert groups["inference"]["replicas"] >= config.ray.inference_replicas
    # Learner workers take learner pods, one each; the driver reserves {driver: 1} there and no GPU,
    # so the pod's one GPU stays free for its worker (docs/ray.md submits it so).
    learner_pod = json.loads(json.loads(groups["learner"]["rayStartParams"]["resources"]))
    assert config.ray.learner_resources == {"learner": 1}
    assert learner_pod == {**config.ray.learner_resources, "driver": 1}
    assert groups["learner"]["replicas"] >= config.ray.learner_workers
    guide = (REPO / "docs" / "ray.md").read_text()
    assert "--entrypoint-resources '{\"driver\": 1}'" in guide and "--entrypoint-num-gpus" not in guide
    for group in groups.values():
        (container,) = group["template"]["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # Agents reach the gateway in the driver on a learner pod, at policy_server.port.
    (service,) = [doc for doc in documents if doc["kind"] == "Service"]
    assert service["spec"]["selector"]["ray.io/group"] == "learner"
    assert service["spec"]["ports"][0]["targetPort"] == config.policy_server.port


def test_adapters_travel_in_the_dtype_replicas_serve_them_in(tmp_path: Path) -> None:
    model = json.loads((REPO / "tests/trainer/model_configs/smollm2-135m.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**model, "torch_dtype": "float16"}))
    vllm = TrainConfig.model_validate({"engine": "vllm", "ray": {}})
    assert adapter_serving_dtype(vllm, tmp_path, on_gpus=True) == "float16"  # vLLM's dtype auto
    told = TrainConfig.model_validate({"engine": "vllm", "ray": {}, "vllm": {"dtype": "bfloat16"}})
    assert adapter_serving_dtype(told, tmp_path, on_gpus=True) == "bfloat16"
    assert adapter_serving_dtype(vllm, tmp_path, on_gpus=False) is None  # vLLM's CPU build: float32
    hf = TrainConfig.model_validate({"ray": {}})
    assert adapter_serving_dtype(hf, tmp_path, on_gpus=True) is None  # peft keeps LoRA in float32
    assert adapter_serving_dtype(vllm, tmp_path / "missing", on_gpus=True) is None
