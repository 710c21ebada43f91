"""``agentbolt train`` with an agent that makes every mistake new users make (issue 22): it raises, returns None,
returns a string, calls the server's root instead of ``llm.endpoint``, calls a port where nothing listens, hangs.
Nothing is trainable, so the job stops after ``fail_after`` steps with exit code 1, and each cause is named in the
terminal, in ``summary.json``, on the dashboard's Errors API and by ``agentbolt rollouts``. A real job (SmolLM2,
runner processes, the gateway), a real ``agentbolt serve`` on the job's store afterwards."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
from tests.integration.serve_process import start_serve

REPO = Path(__file__).resolve().parents[2]

KINDS = ["raises", "returns_none", "returns_string", "gateway_root", "wrong_port", "hangs"]

CONFIG = """\
model: smollm2-135m
agent: tests.integration.broken_agents:broken
tasks: {tasks}
val_size: 0
eval_before: false
eval_after: false
runner_processes: 1
runner_concurrency: 12
grpo:
  steps: 4
  tasks_per_step: 6
  group_size: 2
  max_tokens: 8
  rollout_timeout_s: 4
  max_attempts: 1
  fail_after: 2
"""


def _train(config: Path, out: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], str]:
    """``agentbolt train CONFIG --out OUT`` in a subprocess: the finished process and its stdout + stderr."""
    job = subprocess.run(
        [sys.executable, "-m", "agentbolt.cli.main", "train", str(config), "--out", str(out)],
        cwd=REPO,
        env={**env, "COLUMNS": "250"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    return job, job.stdout + job.stderr


def _train_short(
    tmp_path: Path, smollm2_dir: Path, kind: str, *, n_tasks: int, steps: int
) -> tuple[subprocess.CompletedProcess[str], str]:
    """``_train`` of ``n_tasks`` tasks of one ``kind``, two a step for ``steps`` steps, into ``tmp_path/run``."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"{kind}{i}", "kind": kind}) + "\n" for i in range(n_tasks)))
    config = tmp_path / "config.yaml"
    config.write_text(
        CONFIG.format(tasks=tasks)
        .replace("steps: 4", f"steps: {steps}")
        .replace("tasks_per_step: 6", "tasks_per_step: 2")
    )
    env = {**os.environ, "AGENTBOLT_CACHE": str(smollm2_dir.parent.parent)}
    return _train(config, tmp_path / "run", env)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_each_mistake_is_named_and_the_job_fails(tmp_path: Path, smollm2_dir: Path) -> None:
    port = _free_port()  # closed again: nothing listens there
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": k, "kind": k, "port": port}) + "\n" for k in KINDS))
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(tasks=tasks))
    out = tmp_path / "run"
    env = {**os.environ, "AGENTBOLT_CACHE": str(smollm2_dir.parent.parent), "COLUMNS": "250"}
    job, text = _train(config, out, env)
    assert job.returncode == 1, text
    assert "Traceback" not in text, text
    # the step lines and the one-screen summary name every cause, with an example and what to do
    for cause in ("agent_exception", "no_reward", "bad_reward", "no_gateway_call", "timeout"):
        assert cause in text, (cause, text)
    assert "ValueError: the agent tripped on purpose" in text
    assert f"127.0.0.1:{port}" in text  # the connection error names the URL the agent used
    assert "no trainable trajectory in 2 consecutive steps" in text
    assert "llm.endpoint" in text  # the hint of no_gateway_call
    assert "step 3:" not in text  # the job stopped after two empty steps
    assert "2 LLM calls reached the server's plain /v1 routes" in text  # gateway_root, group of 2, a step

    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_for_failures"] is True
    assert summary["failure_causes"] == {
        "agent_exception": 8,  # raises and wrong_port, twice a step (group_size 2), in two steps
        "no_reward": 4,
        "bad_reward": 4,
        "no_gateway_call": 4,
        "timeout": 4,
    }
    assert "str" in summary["failure_examples"]["bad_reward"]
    assert summary["unscoped_gateway_calls"] == 4

    listed = subprocess.run(
        [sys.executable, "-m", "agentbolt.cli.main", "rollouts", "--store", str(out / "store.db"), "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert sorted(r["cause"] for r in rows) == sorted(
        ["agent_exception"] * 8 + ["no_reward"] * 4 + ["bad_reward"] * 4 + ["no_gateway_call"] * 4 + ["timeout"] * 4
    )
    no_reward = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentbolt.cli.main",
            "rollouts",
            "--store",
            str(out / "store.db"),
            "--cause",
            "no_reward",
        ],
        cwd=REPO,
        env={k: v for k, v in env.items() if k != "COLUMNS"},  # as a pipe to less or grep has it
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert no_reward.returncode == 0 and "no_reward 4" in " ".join(no_reward.stdout.split()), no_reward.stdout
    # piped: the table keeps its own width (rich would cut it to 80 columns: "atte…", "succe…")
    assert "attempts" in no_reward.stdout, no_reward.stdout
    assert "4 rollouts, newest first" in " ".join(no_reward.stdout.split())  # all that match: nothing cut

    def listing(*extra: str) -> str:
        cmd = [sys.executable, "-m", "agentbolt.cli.main", "rollouts", "--store", str(out / "store.db"), *extra]
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return " ".join(done.stdout.split())

    # a listing cut by --limit says so (was: "3 rollouts", as if no more were stored)
    assert "the newest 3 rollouts; more match (raise --limit to see them)" in listing("--limit", "3")
    assert "more match" not in listing("--cause", "no_reward", "--limit", "4")

    serve, url = start_serve("--store", f"sqlite:///{out / 'store.db'}", "--port", "0")
    try:
        kinds = {k["kind"]: k for k in httpx.get(f"{url}/v1/errors/summary", timeout=30).json()["kinds"]}
    finally:
        serve.terminate()
        serve.wait(10)
    assert kinds["agent_exception:ValueError"]["count"] == 4
    assert kinds["agent_exception:APIConnectionError"]["count"] == 4
    assert kinds["no_reward"]["count"] == 4 and kinds["bad_reward"]["count"] == 4
    assert kinds["timeout"]["count"] == 4
    assert kinds["no_gateway_call"]["count"] == 4


def test_a_one_step_run_that_trained_nothing_fails_with_its_causes(tmp_path: Path, smollm2_dir: Path) -> None:
    """Shorter than ``fail_after``: the only step had nothing trainable, so the job exits 1 with the causes instead
    of ending 0 with a checkpoint of unchanged weights."""
    out = tmp_path / "run"
    job, text = _train_short(tmp_path, smollm2_dir, "raises", n_tasks=3, steps=1)
    assert job.returncode == 1, text
    assert "no trainable trajectory in any of the 1 steps run: nothing was trained" in text
    assert "ValueError: the agent tripped on purpose" in text and "Traceback" not in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_for_failures"] is True and summary["train_reward"] == [None]
    assert summary["failure_causes"] == {"agent_exception": 4}
    # no checkpoint of the untrained weights, so a --resume cannot turn this run into a finished "success"
    assert summary["checkpoints"] == [] and not list((out / "checkpoints").glob("step-*"))
    assert "no checkpoint was written by this run (nothing was trained)" in text


def test_a_run_whose_every_update_was_skipped_warns_that_its_checkpoints_are_untrained(
    tmp_path: Path, smollm2_dir: Path
) -> None:
    """Every rollout works but each group's rewards tie, so every advantage is 0 and no step moves the weights: the
    job ends 0 (its rollouts are valid data) but says so, with what to do, instead of "next: serve it" hints for
    a checkpoint of the base model; summary.json counts the updates."""
    out = tmp_path / "run"
    job, text = _train_short(tmp_path, smollm2_dir, "same_reward", n_tasks=4, steps=2)
    assert job.returncode == 0, text
    flat = " ".join(text.split())
    assert "update skipped: every advantage is 0" in flat, text
    assert "warning: no step updated the weights (2 steps, every update skipped: every advantage is 0 x2)" in flat
    assert "hold the weights this run started from (smollm2-135m, untrained)" in flat
    assert "grpo.group_size" in flat  # what to do
    assert "serve it" not in flat and "export-model" not in flat
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates_applied"] == 0
    assert summary["updates_skipped"] == {"every advantage is 0": 2}
    assert summary["train_reward"] == [0.5, 0.5] and summary["failure_causes"] == {}
    # off a terminal, no tqdm frames of transformers' model loading in the log (agentbolt prints plain lines there)
    assert "Loading weights" not in text and "it/s]" not in text, text
