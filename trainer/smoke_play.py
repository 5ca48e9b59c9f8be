"""``rft smoke URL --model DIR``: play real episodes of the payload's row against a local policy.

``rft smoke``'s refusal check (:mod:`handlers.smoke`) proves the plumbing; this plays the row for real,
so a tool bug or a reward bug shows before any training. The model is served in this process as
``rft serve --open-job`` serves it (the hf engine behind the policy gateway, on loopback, demanding the
key the payload hands the agent, or the SageMaker tokens ``--accept-sagemaker-tokens`` takes), each
episode's rollout is opened on it, the agent is sent the payload with ``metadata.endpoint`` pointing at
it, and the gateway's record of the episode's calls is printed as ``rft show`` prints a run's
transcripts, with the reward and the agent's metrics. An episode is judged as training judges a rollout
(:func:`trainer.rollouts.refusals.check_model_calls`): one whose model calls were all refused, or that
made none, failed, whatever reward the agent answered.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from handlers import (
    AgentAnswer,
    FailureCause,
    RftkitExtras,
    RolloutPayload,
    SageMakerTokenPolicy,
    invocations_url,
    read_answer,
)
from policy_server import PolicyServer, RolloutTrace, serve_gateway
from trainer.ops.show import render_episode
from trainer.ops.transcripts import Decode, call_view
from trainer.rollouts.outcomes import RolloutOutcome
from trainer.rollouts.refusals import check_model_calls

EXIT_PLAYED = 0
EXIT_EPISODE_FAILED = 3  # rft smoke's "agent error"
EXIT_CALLS_REFUSED = 4  # rft smoke's "access denied": a credential a run would refuse
DEFAULT_MAX_TOKENS = 1024
# What reward checks say of a reward that is not a number (rft_app's and the trainer's reading).
NOT_A_NUMBER_MARKERS = ("must be a number", "is not finite")


class ModelDirError(ValueError):
    """--model names no model directory."""


@contextmanager
def served_policy(
    model_dir: Path,
    api_key: str | None,
    chat_template: str | None,
    sagemaker_tokens: SageMakerTokenPolicy | None = None,
) -> Iterator[Any]:
    """The hf engine on ``model_dir`` behind the policy gateway on a free loopback port, as
    ``rft serve`` starts it (CPU float32 unless CUDA is here), taking the credentials a run takes
    (``api_key``, and SageMaker tokens by ``sagemaker_tokens``); yields its serving thread."""
    import torch

    from policy_server.engines import HFEngine

    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    engine = HFEngine(model_dir, device=device, dtype=dtype, chat_template=chat_template)
    server = PolicyServer(engine, api_key=api_key, sagemaker_tokens=sagemaker_tokens)
    thread = serve_gateway(server, "127.0.0.1", 0, log_level="warning").start()
    try:
        yield server, thread
    finally:
        thread.stop()


def episode_payload(payload: RolloutPayload, rollout_id: str, endpoint: str, api_key: str | None) -> Any:
    """The payload an episode's agent gets: its own rollout id, the served endpoint and the key."""
    metadata = payload.metadata.model_copy(update={"rollout_id": rollout_id, "endpoint": endpoint})
    extras = payload.rftkit or RftkitExtras()
    if api_key is not None:
        extras = extras.model_copy(update={"api_key": api_key})
    return payload.model_copy(update={"metadata": metadata, "rftkit": extras}).to_wire()


def conversation(trace: RolloutTrace, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last call's messages as the gateway recorded them, then the model's answer to them."""
    if not trace.calls or not trace.calls[-1].messages:
        return []
    reply = calls[-1]
    answer: dict[str, Any] = {"role": "assistant", "content": reply["content"]}
    if reply["tool_calls"]:
        answer["tool_calls"] = reply["tool_calls"]
    return [*trace.calls[-1].messages, answer]


def reward_problem(answer: AgentAnswer) -> str | None:
    """A sentence when the agent's reward is not a number (a string "1.0", NaN), else None."""
    error = answer.error or ""
    if answer.cause is FailureCause.BAD_REWARD or any(marker in error for marker in NOT_A_NUMBER_MARKERS):
        return (
            f"the agent's reward is not a number ({error}): return a float from the rollout "
            "function, e.g. float(score), not a string; a run fails every such rollout"
        )
    return None


def judged(answer: AgentAnswer, trace: RolloutTrace) -> AgentAnswer:
    """``answer`` as training judges the rollout: failed by ``model_calls_refused`` or
    ``no_model_calls`` when the gateway recorded no call of it (:func:`check_model_calls`)."""
    played = answer.cause is None
    outcome = RolloutOutcome(
        rollout_id=trace.rollout_id,
        group_index=0,
        status="ok" if played else "failed",
        cause=answer.cause,
        rewards=answer.rewards if played else None,
        reward=math.fsum(answer.rewards) if played and answer.rewards else None,
        error=answer.error,
    )
    checked = check_model_calls(outcome, trace)
    if checked is outcome:
        return answer
    return AgentAnswer(
        checked.cause, metrics=answer.metrics, error=checked.error, status_code=answer.status_code
    )


def episode_view(number: int, answer: AgentAnswer, trace: RolloutTrace, decode: Decode) -> dict[str, Any]:
    """One played episode in the shape ``rft show`` renders."""
    calls = [call_view(call, decode) for call in trace.calls]
    failure = None
    if answer.cause is not None:
        failure = {"cause": answer.cause.value, "error": reward_problem(answer) or answer.error}
    return {
        "kind": "episode",
        "step": number,
        "row_name": "the payload's row",
        "group": 0,
        "status": "played" if answer.cause is None else "failed",
        "reward": math.fsum(answer.rewards) if answer.rewards else None,
        "metrics": answer.metrics,
        "messages": conversation(trace, calls),
        "calls": calls,
        "failure": failure,
    }


def play_one(
    target: str, payload: RolloutPayload, server: PolicyServer, endpoint: str, number: int, timeout: float
) -> tuple[AgentAnswer, RolloutTrace]:
    """Play episode ``number``: open its rollout, send the agent the payload, take the trace."""
    job_arn = payload.metadata.job_arn
    rollout_id = f"{payload.metadata.rollout_id}-play-{number}"
    server.open_rollout(job_arn, rollout_id)
    try:
        sent = episode_payload(payload, rollout_id, endpoint, server.api_key)
        response = httpx.post(invocations_url(target), json=sent, timeout=timeout)
        answer = read_answer(response.status_code, response.content)
    except httpx.HTTPError as exc:
        answer = AgentAnswer(FailureCause.TRANSPORT, error=f"{type(exc).__name__}: {exc}", status_code=0)
    trace = server.take_trace(job_arn, rollout_id)
    server.release_trace(trace)
    return judged(answer, trace), trace


def play(
    target: str,
    payload: RolloutPayload,
    model_dir: Path,
    *,
    episodes: int = 1,
    timeout: float = 60.0,
    api_key: str | None = None,
    chat_template: str | None = None,
    sagemaker_tokens: SageMakerTokenPolicy | None = None,
) -> int:
    """Play ``episodes`` episodes of ``payload``'s row at the agent ``target`` against the model in
    ``model_dir``, print each one, and return 0 when all came back with a reward, 4 when an episode's
    model calls were all refused (a credential a run refuses), else 3."""
    from policy_server.models import load_tokenizer

    if not (model_dir / "config.json").is_file():
        raise ModelDirError(f"{model_dir} is not a model directory (no config.json in it)")
    tokenizer = load_tokenizer(model_dir, chat_template)

    def decode(ids: list[int], keep_special: bool) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=not keep_special))

    max_tokens = (payload.inference_params and payload.inference_params.max_tokens) or DEFAULT_MAX_TOKENS
    failed: list[FailureCause] = []
    with served_policy(model_dir, api_key, chat_template, sagemaker_tokens) as (server, thread):
        server.open_job(payload.metadata.job_arn, max_tokens=max_tokens)
        print(f"playing {episodes} episode(s) of the payload's row against {model_dir} at {thread.url}")
        for number in range(1, episodes + 1):
            answer, trace = play_one(target, payload, server, thread.url, number, timeout)
            failed += [answer.cause] if answer.cause is not None else []
            print("\n" + render_episode(episode_view(number, answer, trace, decode)))
    print(f"\n{episodes - len(failed)} of {episodes} episode(s) came back with a reward")
    if FailureCause.MODEL_CALLS_REFUSED in failed:
        return EXIT_CALLS_REFUSED
    return EXIT_EPISODE_FAILED if failed else EXIT_PLAYED
