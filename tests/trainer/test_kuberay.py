"""deploy/kuberay/: each example's train.yaml, loaded with rftkit's own config loader, agrees with its
manifests (pods hold the replicas and learner workers the config asks for, agents and gateway reach
each other inside the cluster, the image installs at constraints.txt's versions) and is planned by
`rft plan`; the 8-GPU example runs Qwen3-VL-8B on 2 nodes x 8 GPUs."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from handlers import is_runtime_arn
from handlers.cli import main as rft
from trainer.config import TrainConfig, load_config

REPO = Path(__file__).resolve().parents[2]
KUBERAY = REPO / "deploy" / "kuberay"
EXAMPLES = [KUBERAY, KUBERAY / "qwen3-vl-8b"]
CLUSTER_DNS = re.compile(r"^(?P<service>[a-z0-9-]+)\.(?P<namespace>[a-z0-9-]+)\.svc\.cluster\.local$")


def _documents(example: Path) -> list[dict[str, Any]]:
    """The example's RayCluster and Services, and the agent beside them (agent.yaml)."""
    paths = [example / "raycluster.yaml", KUBERAY / "agent.yaml"]
    return [doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc]


def _groups(documents: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    (cluster,) = [doc for doc in documents if doc["kind"] == "RayCluster"]
    return {group["groupName"]: group for group in cluster["spec"]["workerGroupSpecs"]}


def _advertised(group: dict[str, Any]) -> dict[str, float]:
    """The Ray resources one pod of ``group`` advertises, GPUs included."""
    params = group["rayStartParams"]
    (container,) = group["template"]["spec"]["containers"]
    gpus = float(params.get("num-gpus", container["resources"]["limits"].get("nvidia.com/gpu", 0)))
    custom = json.loads(json.loads(params["resources"])) if "resources" in params else {}
    return {"GPU": gpus, **custom}


def _room(groups: dict[str, dict[str, Any]], asks: dict[str, float]) -> int:
    """How many actors asking ``asks`` the groups' pods hold at once."""
    room = 0
    for group in groups.values():
        pod = _advertised(group)
        wanted = {name: amount for name, amount in asks.items() if amount > 0}
        room += group["replicas"] * int(min(pod.get(name, 0.0) // amount for name, amount in wanted.items()))
    return room


def _service(documents: list[dict[str, Any]], url: str) -> dict[str, Any]:
    """The Service of these manifests that the cluster-internal ``url`` names, at the URL's port."""
    parts = urlsplit(url)
    named = CLUSTER_DNS.match(parts.hostname or "")
    assert named, f"{url} is not a cluster-internal Service address"
    services = [d for d in documents if d["kind"] == "Service" and d["metadata"]["name"] == named["service"]]
    assert services, f"{url}: no Service {named['service']} in the manifests"
    port = parts.port or 80
    assert any(p["port"] == port for p in services[0]["spec"]["ports"]), f"{url}: no port {port}"
    return services[0]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_each_example_agrees_with_its_manifests(example: Path) -> None:
    config = load_config(example / "train.yaml")
    assert config.ray is not None and config.ray.address == "auto"
    documents = _documents(example)
    groups = _groups(documents)
    replica_gpus = float(config.vllm.tensor_parallel_size or 1)
    replica = {"GPU": replica_gpus, **config.ray.replica_resources}
    assert _room(groups, replica) >= config.ray.inference_replicas
    learner = {"GPU": 1.0, **config.ray.learner_resources}
    assert _room(groups, learner) >= config.ray.learner_workers
    # The driver ({driver: 1}, no GPU) lands where the gateway Service looks for it, on a learner pod.
    (gateway,) = [
        doc for doc in documents if doc["kind"] == "Service" and "ray.io/group" in doc["spec"]["selector"]
    ]
    assert _advertised(groups[gateway["spec"]["selector"]["ray.io/group"]]).get("driver") == 1
    assert gateway["spec"]["ports"][0]["targetPort"] == config.policy_server.port
    _agents_reach_the_gateway(config, documents, gateway)


def _agents_reach_the_gateway(
    config: TrainConfig, documents: list[dict[str, Any]], gateway: dict[str, Any]
) -> None:
    """Agents in the cluster (a Service of agent.yaml), calling the gateway at its cluster address."""
    public_url = config.policy_server.public_url
    assert public_url is not None
    assert _service(documents, public_url) is gateway
    for target in config.agents:
        # An AgentCore Runtime agent runs outside the cluster: it cannot resolve *.svc.cluster.local.
        assert not is_runtime_arn(target), f"{target} cannot reach {public_url}"
        agent = _service(documents, target)
        (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
        assert (
            agent["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        )


def test_the_8_gpu_example_runs_qwen3_vl_8b_on_two_nodes_of_8_gpus() -> None:
    example = KUBERAY / "qwen3-vl-8b"
    config = load_config(example / "train.yaml")
    assert config.ray is not None and Path(config.model or "").name == "Qwen3-VL-8B-Instruct"
    groups = _groups(_documents(example))
    assert sum(group["replicas"] for group in groups.values()) == 2  # two GPU nodes, one pod each
    for group in groups.values():
        (container,) = group["template"]["spec"]["containers"]
        assert (
            container["resources"]["limits"]["nvidia.com/gpu"] == "8" == group["rayStartParams"]["num-gpus"]
        )
        shm = [v for v in group["template"]["spec"]["volumes"] if v["name"] == "dshm"]
        assert shm and shm[0]["emptyDir"]["sizeLimit"] == "64Gi"  # NCCL and vLLM need more than 64 MB
    # Replicas per pod: every inference pod holds 8, one per GPU.
    assert _advertised(groups["inference"]) == {"GPU": 8.0, "inference": 8}
    assert config.ray.inference_replicas == config.ray.learner_workers == 8
    (learner_pod,) = groups["learner"]["template"]["spec"]["containers"]
    nccl = {item["name"]: item["value"] for item in learner_pod["env"]}
    assert nccl["NCCL_SOCKET_IFNAME"] == "eth0" and nccl["NCCL_DEBUG"] == "WARN"
    assert config.placement.num_gpus == 8 and config.placement.gpu_memory_gb == 80


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_rft_plan_plans_each_example(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    published = {KUBERAY: "qwen3-8b.json", KUBERAY / "qwen3-vl-8b": "qwen3-vl-8b.json"}[example]
    # Off the cluster: the learner pod's GPUs declared (the 8-GPU example declares its own).
    declared = ["placement.num_gpus=1", "placement.gpu_memory_gb=48"] if example == KUBERAY else []
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(REPO / "tests" / "trainer" / "model_configs" / published, model / "config.json")
    code = rft(["plan", str(example / "train.yaml"), f"model={model}", *declared, "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert json.loads(out)["fits"] is True


def test_the_image_installs_rftkit_at_constraints_versions() -> None:
    dockerfile = (KUBERAY / "Dockerfile").read_text()
    installs = [line for line in dockerfile.splitlines() if "pip install" in line and "rftkit[" in line]
    assert installs and all("-c /home/ray/rftkit/constraints.txt" in line for line in installs)
    pinned_ray = re.search(r"^ray==(\S+)$", (REPO / "constraints.txt").read_text(), re.MULTILINE)
    assert pinned_ray and f"FROM rayproject/ray:{pinned_ray[1]}-" in dockerfile
    for example in EXAMPLES:
        (cluster,) = [doc for doc in _documents(example) if doc["kind"] == "RayCluster"]
        assert cluster["spec"]["rayVersion"] == pinned_ray[1]
