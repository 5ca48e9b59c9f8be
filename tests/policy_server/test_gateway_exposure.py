"""A gateway reachable from other machines that checks no credential refuses to start unless told so,
in `rft serve`, in a run's config and in the gateway itself, with the sentence a user sees."""

from __future__ import annotations

from pathlib import Path

import pytest

from handlers import SageMakerTokenPolicy, exposure_refusal
from policy_server.cli import main
from policy_server.engines.hf import HFEngine
from policy_server.running import ServerThread, check_exposure
from policy_server.server import PolicyServer

REFUSAL = (
    "refusing to serve on 0.0.0.0 without any credential check: it is reachable from other machines, "
    "and anyone who can reach it could use the model, spend its compute and send calls and rewards into "
    "open rollouts. Give the agents a key (policy_server.api_key: leave it unset for a fresh key per "
    "run, or set your own; rft serve --api-key), bind 127.0.0.1, or, on a network you trust, set "
    "policy_server.allow_unauthenticated_network: true (rft serve --allow-unauthenticated-network)."
)


def test_only_a_reachable_host_without_any_credential_check_is_refused() -> None:
    for loopback in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert exposure_refusal(loopback, None, sagemaker_tokens=False) is None
    assert exposure_refusal("0.0.0.0", "key", sagemaker_tokens=False) is None
    assert exposure_refusal("0.0.0.0", None, sagemaker_tokens=True) is None
    assert exposure_refusal("0.0.0.0", None, sagemaker_tokens=False) == REFUSAL
    # A name other than localhost may resolve to any address.
    assert exposure_refusal("trainer.internal", None, sagemaker_tokens=False) is not None


def test_rft_serve_refuses_a_reachable_host_without_a_key_before_loading_the_model(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--model", str(tiny_model_dir), "--host", "0.0.0.0", "--port", "0"]) == 2
    assert capsys.readouterr().out == f"rft serve: {REFUSAL}\n"


def test_the_gateway_itself_refuses_unless_told_so(tiny_model_dir: Path) -> None:
    with pytest.raises(RuntimeError) as caught:
        ServerThread(PolicyServer(HFEngine(tiny_model_dir)), host="0.0.0.0").start()
    assert str(caught.value) == REFUSAL

    told = PolicyServer(HFEngine(tiny_model_dir), allow_unauthenticated_network=True)
    guarded = PolicyServer(HFEngine(tiny_model_dir), sagemaker_tokens=SageMakerTokenPolicy())
    # Checked without binding: servers in tests listen on loopback only.
    check_exposure("0.0.0.0", told)
    check_exposure("0.0.0.0", guarded)
