"""A run stopped in the middle of step 2 (SIGKILL, SIGTERM, Ctrl-C) and resumed ends with the adapter an
uninterrupted run ends with, bit for bit; what the user sees; no process the run started outlives it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agents.letters.main import app
from agents.letters.run_files import serving, write_run_files
from tests.process_tree import alive, descendants
from trainer.cli import main as cli_main
from trainer.config import load_config
from trainer.config.faults import FaultsConfig
from trainer.learner.checkpoint import latest_checkpoint
from trainer.loop import train
from trainer.ops.status import main as status_main
from trainer.run import LOG_FILE, RunSummary

KILL_AT = "step 2: rollouts started"


def _rft_train(config_path: Path, run_dir: Path, *flags: str) -> list[str]:
    """``rft train`` in a process of its own (a signal there cannot reach the test)."""
    return [
        sys.executable,
        "-m",
        "handlers.cli",
        "train",
        str(config_path),
        "--output-dir",
        str(run_dir),
        *flags,
    ]


def _wait_for_line(path: Path, text: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.is_file() and text in path.read_text():
            return
        if process.poll() is not None:
            raise AssertionError(f"rft train exited ({process.returncode}) before {text!r}")
        time.sleep(0.02)
    raise AssertionError(f"{text!r} did not appear in {path} within {timeout_s} s")


@dataclass
class Runs:
    """The module's agent, config and uninterrupted run, which every test compares with."""

    config_path: Path
    uninterrupted: RunSummary


@pytest.fixture(scope="module")
def runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    tmp_path = tmp_path_factory.mktemp("resume")
    with serving(app) as agent_url:
        # Exact equality needs batch-invariant numerics: with one call per engine batch, a call's logits
        # (and so the recorded behavior logprobs) do not depend on which rollouts ran beside it. Each
        # rollout's own sampling seed makes its tokens independent of the order requests arrive in.
        config_path = write_run_files(
            tmp_path, tiny_model_dir, agent_url, eval_file=None, hf={"max_batch_size": 1}
        )
        yield Runs(config_path, train(load_config(config_path, ["output_dir=uninterrupted"])))


@pytest.fixture(scope="module")
def async_runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    """The same run with ``max_off_policy_steps: 1``: step s+1's rollouts play during step s's update,
    so a kill finds a step's rollouts in flight, some finished and some not."""
    tmp_path = tmp_path_factory.mktemp("resume-async")
    with serving(app) as agent_url:
        config_path = write_run_files(
            tmp_path,
            tiny_model_dir,
            agent_url,
            eval_file=None,
            hf={"max_batch_size": 1},
            max_off_policy_steps=1,
            save_total_limit=3,
        )
        yield Runs(config_path, train(load_config(config_path, ["output_dir=uninterrupted"])))


def _assert_resumed_exactly(runs: Runs, run_dir: Path) -> None:
    """Resume ``run_dir``: the adapter, the steps logged and the rewards of the uninterrupted run."""
    uninterrupted = runs.uninterrupted
    resumed = train(load_config(runs.config_path, [f"output_dir={run_dir}"]), resume=True)
    assert resumed.steps == uninterrupted.steps == 3
    assert resumed.adapter_dir is not None and uninterrupted.adapter_dir is not None
    expected = load_file(uninterrupted.adapter_dir / "adapter_model.safetensors")
    actual = load_file(resumed.adapter_dir / "adapter_model.safetensors")
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[name], actual[name]) for name in expected)
    # Nothing lost or repeated: each step logged once.
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    rewards = [record["reward_mean"] for record in resumed.history]
    assert rewards == [record["reward_mean"] for record in uninterrupted.history]


def _sigkill_at(config_path: Path, run_dir: Path, line: str) -> int:
    """Run ``rft train``, SIGKILL it once ``line`` is in its log, check that no process it started
    outlives it (docs/operations.md, the fault matrix); its pid."""
    process = subprocess.Popen(
        _rft_train(config_path, run_dir), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        # Only bounds a hang: the wait ends as soon as the line appears or the process exits, and
        # a machine shared with other work may take minutes to import, build and play step 1.
        _wait_for_line(run_dir / LOG_FILE, line, process, timeout_s=900)
        started = descendants(process.pid)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in started) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in started if alive(pid)]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == -signal.SIGKILL
    return process.pid


def test_sigkill_mid_step_then_resume_matches_an_uninterrupted_run(
    runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_path = runs.config_path
    killed_dir = tmp_path / "killed"
    pid = _sigkill_at(config_path, killed_dir, KILL_AT)
    latest = latest_checkpoint(killed_dir / "checkpoints")
    assert latest is not None and latest.name == "step-000001", "the kill did not land in step 2"
    run_id = json.loads((latest / "state.json").read_text())["mlflow_run_id"]

    # Its recorded pid is never signalled again (SIGUSR1 would end whatever process reused it).
    assert status_main([str(killed_dir), "--stacks"]) == 1
    assert f"(pid {pid}) is gone: it was killed" in capsys.readouterr().out

    # Starting over in a run directory that holds checkpoints is refused with the way out.
    assert cli_main([str(config_path), "--output-dir", str(killed_dir)]) == 1
    assert "pass --resume" in capsys.readouterr().err

    _assert_resumed_exactly(runs, killed_dir)
    # The same MLflow run continued.
    final_state = json.loads((killed_dir / "checkpoints" / "step-000003" / "state.json").read_text())
    assert final_state["mlflow_run_id"] == run_id
    assert [record["step"] for record in final_state["history"]] == [1, 2, 3]


def test_sigkill_with_rollouts_in_flight_then_resume_matches_an_uninterrupted_run(
    async_runs: Runs, tmp_path: Path
) -> None:
    """``max_off_policy_steps: 1``, two rows a step, killed while step 3's rollouts play beside step
    2's update: the resume replays the rollouts the kill cut short on their own adapter version with
    their own seeds, keeps those a checkpoint holds, and trains every row once, in order."""
    killed_dir = tmp_path / "killed"
    _sigkill_at(async_runs.config_path, killed_dir, "step 3: rollouts started")
    latest = latest_checkpoint(killed_dir / "checkpoints")
    # Step s samples on the adapter after step s - 2; a checkpoint after step s holds step s + 1,
    # already submitted on version s - 1, with the rollouts it had finished.
    assert latest is not None and latest.name in ("step-000001", "step-000002")
    last = int(latest.name.removeprefix("step-"))
    in_flight = json.loads((latest / "rollouts.json").read_text())
    assert [(step["step"], step["adapter_version"]) for step in in_flight] == [(last + 1, last - 1)]
    _assert_resumed_exactly(async_runs, killed_dir)
    kept = len(in_flight[0]["finished"])
    said = f"step {last + 1}: {kept} rollouts kept from the checkpoint, {8 - kept} played again"
    assert said in (killed_dir / LOG_FILE).read_text()
    history = async_runs.uninterrupted.history
    assert [record["sampled_adapter_versions"] for record in history] == [[0], [0], [1]]


def _stopped_by(signum: int, command: list[str], log: Path, at: str = KILL_AT) -> tuple[int, str, float]:
    """Run ``command``, send it ``signum`` once ``at`` is in its log; its exit code, its stderr,
    and the seconds from the signal to its exit. A process of its own: the grace's exit or a signal
    that lands after the run ended can never reach the test's process."""
    # SIGINT at its default, so that Python in the child turns it into KeyboardInterrupt even where
    # the test runner ignores it.
    process = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        _wait_for_line(log, at, process, timeout_s=900)
        sent = time.monotonic()
        process.send_signal(signum)
        _, err = process.communicate(timeout=300)
        return process.returncode, err, time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _signalled_at(signum: int, config_path: Path, run_dir: Path, at: str) -> tuple[int, str, float]:
    """``rft train`` that sends itself ``signum`` as it logs ``at`` (tests/trainer/signal_on_log.py):
    its exit code, its stderr, and the seconds from the line's appearing in the log to its exit."""
    command = [sys.executable, "-m", "tests.trainer.signal_on_log", str(int(signum)), at]
    process = subprocess.Popen(
        [*command, "train", str(config_path), "--output-dir", str(run_dir)], stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for_line(run_dir / LOG_FILE, at, process, timeout_s=900)
        seen = time.monotonic()
        _, err = process.communicate(timeout=300)
        return process.returncode, err, time.monotonic() - seen
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize(
    ("on_sigterm", "checkpoint", "said"),
    [
        ("abandon_step", "step-000001", "step 2 abandoned, its finished rollouts kept"),
        ("finish_step", "step-000002", "after step 2"),
    ],
    ids=["abandon_step", "finish_step"],
)
def test_sigterm_mid_step_checkpoints_exits_0_and_resumes_exactly(
    runs: Runs, tmp_path: Path, on_sigterm: str, checkpoint: str, said: str
) -> None:
    run_dir = tmp_path / "preempted"
    flags = ("--set", f"faults.on_sigterm={on_sigterm}")
    code, err, stopped_s = _stopped_by(
        signal.SIGTERM, _rft_train(runs.config_path, run_dir, *flags), run_dir / LOG_FILE
    )
    assert code == 0, err[-2000:]
    assert stopped_s < FaultsConfig().sigterm_grace_s
    assert (
        f"rft train: stopped by SIGTERM ({said}); checkpoint {run_dir / 'checkpoints' / checkpoint}; " in err
    )
    argv = [str(runs.config_path), "--output-dir", str(run_dir), *flags]
    assert f"resume with `rft train {' '.join(argv)} --resume`" in err
    assert latest_checkpoint(run_dir / "checkpoints") == run_dir / "checkpoints" / checkpoint
    _assert_resumed_exactly(runs, run_dir)


@pytest.mark.parametrize(
    "at",
    ["step 2: update started", "step 2: publishing adapter v2", "step 2: checkpoint started"],
    ids=["update", "publish", "checkpoint"],
)
def test_sigterm_after_sampling_finishes_the_step_checkpoints_exits_0_and_resumes_exactly(
    runs: Runs, tmp_path: Path, at: str
) -> None:
    """SIGTERM once step 2's update, publish (the new adapter served) or checkpoint has started, with
    the default ``abandon_step``: nothing already under way is abandoned; step 2 ends, its checkpoint
    is the one the run stops with, and the resume is exact. The run signals itself as it logs the
    phase's start line: a phase of the tiny model lasts milliseconds, and a signal sent by the test
    once the line is in the log file could land after step 2 ended (it did, in a loaded run)."""
    run_dir = tmp_path / "preempted"
    code, err, stopped_s = _signalled_at(signal.SIGTERM, runs.config_path, run_dir, at)
    assert code == 0, err[-2000:]
    assert stopped_s < FaultsConfig().sigterm_grace_s
    checkpoint = run_dir / "checkpoints" / "step-000002"
    assert f"rft train: stopped by SIGTERM (after step 2); checkpoint {checkpoint}; " in err
    assert latest_checkpoint(run_dir / "checkpoints") == checkpoint
    log_lines = (run_dir / LOG_FILE).read_text().splitlines()
    signalled = next(i for i, line in enumerate(log_lines) if "SIGTERM: stopping the step in flight" in line)
    assert next(i for i, line in enumerate(log_lines) if at in line) < signalled
    # Step 2 was trained and recorded once, step 3 never started.
    assert not any("step 3:" in line for line in log_lines)
    _assert_resumed_exactly(runs, run_dir)


def test_ctrl_c_prints_where_the_last_checkpoint_is_instead_of_a_traceback(
    runs: Runs, tmp_path: Path
) -> None:
    run_dir = tmp_path / "interrupted"
    code, err, _ = _stopped_by(signal.SIGINT, _rft_train(runs.config_path, run_dir), run_dir / LOG_FILE)
    assert code == 130, err[-2000:]
    # One line of its own after the progress bars.
    assert err.splitlines()[-1] == (
        f"rft train: interrupted; the last checkpoint is {run_dir / 'checkpoints' / 'step-000001'}; "
        f"resume with `rft train {runs.config_path} --output-dir {run_dir} --resume`"
    )
    assert "Traceback" not in err


def test_a_second_signal_exits_at_once_keeping_the_previous_checkpoint(runs: Runs, tmp_path: Path) -> None:
    run_dir = tmp_path / "twice"
    command = _rft_train(runs.config_path, run_dir, "--set", "faults.on_sigterm=finish_step")
    process = subprocess.Popen(command, stderr=subprocess.PIPE)
    try:
        _wait_for_line(run_dir / LOG_FILE, KILL_AT, process, timeout_s=900)
        process.send_signal(signal.SIGTERM)
        _wait_for_line(run_dir / LOG_FILE, "SIGTERM: finishing the step in flight", process, timeout_s=30)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signal.SIGTERM
    log_text = (run_dir / LOG_FILE).read_text()
    assert (
        f"SIGTERM again: exiting at once; the last checkpoint is {run_dir / 'checkpoints' / 'step-000001'}"
        in log_text
    )
    assert latest_checkpoint(run_dir / "checkpoints") == run_dir / "checkpoints" / "step-000001"


def test_rft_status_stacks_prints_every_thread_of_a_running_trainer(
    runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rft status --stacks` asks a trainer in a process of its own while its step 2 waits (a
    SIGUSR1 that lands after a run ended must not reach the test's process)."""
    run_dir = tmp_path / "stacks"
    process = subprocess.Popen(_rft_train(runs.config_path, run_dir), stderr=subprocess.DEVNULL)
    try:
        _wait_for_line(run_dir / LOG_FILE, KILL_AT, process, timeout_s=900)
        assert status_main([str(run_dir), "--stacks"]) == 0
        assert process.wait(timeout=300) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    stacks = capsys.readouterr().out
    # faulthandler's dump: every thread, the main one waiting for the step's rollouts.
    assert "Thread 0x" in stacks and "(most recent call first):" in stacks
    assert 'trainer/loop.py", line' in stacks and "in sample" in stacks
    # The same dump is in the run's train.log.
    headers = ("Thread 0x", "Current thread", "  File")
    dump = [line for line in stacks.splitlines() if line.startswith(headers)]
    assert len(dump) > 10 and all(line in (run_dir / LOG_FILE).read_text() for line in dump)
    # Once the run is over there is no trainer to ask.
    assert status_main([str(run_dir), "--stacks"]) == 1
    assert f"no trainer is running in {run_dir}" in capsys.readouterr().out
