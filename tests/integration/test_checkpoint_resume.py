"""Checkpoints and resume of ``agentbolt train``, with a real process killed by SIGKILL in the middle of a step.

The agent (``length_agent`` below) asks the embedded SmolLM2-135M through the real gateway and is scored by the
length of its answer (modulo 5), so the rewards of a group differ, the advantages are not zero and AdamW really
steps: the optimizer state that a checkpoint keeps is not empty.

Pinned:
- ``agentbolt train`` (a real CLI process: server, runner processes, LoRA updates) writes ``checkpoints/step-N``
  after every step; SIGKILL during step 2's rollouts leaves step-1 complete and step 2's rollouts unfinished.
- ``--resume`` loads step-1's adapter and optimizer state exactly (compared tensor by tensor with the files), runs
  steps 2 and 3 (never step 1 again), cancels the killed run's rollouts (no rollout is left non-terminal), records
  each step's metrics once, and ignores (deletes) checkpoint folders that were cut short.
- the checkpoint's adapter loads with plain ``PeftModel.from_pretrained``, and each checkpoint is a resources
  version whose metadata names its folder; train rollouts name the checkpoint whose weights they ran on.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agentbolt import LLM, emit_reward, rollout

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


HOLD_ENV, HOLD_AFTER_ENV = "AGENTBOLT_TEST_HOLD", "AGENTBOLT_TEST_HOLD_AFTER"


def _hold_if_asked() -> None:
    """Wait (at most 5 minutes) while the file named by $AGENTBOLT_TEST_HOLD exists, once the file named by
    $AGENTBOLT_TEST_HOLD_AFTER exists: the SIGKILL test holds the rollouts of step 2 until it has killed the job."""
    hold, after = os.environ.get(HOLD_ENV), os.environ.get(HOLD_AFTER_ENV)
    deadline = time.monotonic() + 300
    while hold and after and os.path.exists(hold) and os.path.exists(after) and time.monotonic() < deadline:
        time.sleep(0.1)


@rollout
def length_agent(task: dict, llm: LLM) -> float:
    """One chat call; the reward is the answer's length in characters modulo 5, over 4 (in [0, 1]): any two
    answers of different lengths most likely differ in reward."""
    from openai import OpenAI

    _hold_if_asked()
    client = OpenAI(base_url=llm.endpoint, api_key="x", max_retries=0)
    try:
        reply = client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": task["question"]}],
            **llm.sampling_parameters,
        )
    finally:
        client.close()
    reward = (len(reply.choices[0].message.content or "") % 5) / 4
    emit_reward(reward, name="correct")  # the validation accuracy reads the reward named "correct"
    return reward


def load_train_tasks(size: int = 8) -> list[dict[str, Any]]:
    topics = ["the sea", "a cat", "the moon", "bread", "a river", "snow", "a clock", "trees"]
    return [
        {"task_id": f"t{i}", "question": f"Write one sentence about {topics[i % len(topics)]}."} for i in range(size)
    ]


def load_val_sets(n_per_set: int | None = None) -> dict[str, list[dict[str, Any]]]:
    return {"lengths": load_train_tasks(2)[: n_per_set or 2]}


CONFIG = """\
model: smollm2-135m
agent: tests.integration.test_checkpoint_resume:length_agent
tasks: tests.integration.test_checkpoint_resume
train_size: 8
val_size: 0
runner_processes: 1
runner_concurrency: 4
grpo:
  steps: 3
  tasks_per_step: 2
  group_size: 4  # four answers: a group whose rewards all tie (no step) is rare; with two, CI saw one
  max_tokens: 24
checkpoint:
  every: 1
  keep_last: 5
"""


def _rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _start_train(config_path: Path, out: Path, env: dict[str, str], **popen: Any) -> subprocess.Popen[bytes]:
    """``agentbolt train CONFIG --out OUT`` as a real process, stdout and stderr together in a pipe."""
    return subprocess.Popen(
        [sys.executable, "-m", "agentbolt.cli.main", "train", str(config_path), "--out", str(out)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **popen,
    )


def _wait_for(predicate: Any, timeout_s: float, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"agentbolt train exited ({proc.returncode}) before {what}")
        try:
            if predicate():
                return
        except sqlite3.OperationalError:
            pass  # the store is being created
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_sigkill_mid_step_then_resume(tmp_path: Path, smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from safetensors.torch import load_file

    from agentbolt.algorithms.rl.torch_backend import TorchPolicyTrainer
    from agentbolt.trainer.checkpoint import latest_checkpoint, read_checkpoint
    from agentbolt.trainer.job import run_training
    from agentbolt.trainer.job_config import load_train_config

    cache = smollm2_dir.parent.parent
    config_path = tmp_path / "config.yaml"
    config_path.write_text(CONFIG)
    out = tmp_path / "run"
    db = out / "store.db"
    step1 = out / "checkpoints" / "step-1" / "checkpoint.json"
    hold = tmp_path / "hold"  # the rollouts of step 2 wait while it exists: the job is surely killed mid-step 2
    hold.touch()
    env = {**os.environ, "AGENTBOLT_CACHE": str(cache), HOLD_ENV: str(hold), HOLD_AFTER_ENV: str(step1)}
    proc = _start_train(config_path, out, env)
    try:
        _wait_for(step1.is_file, 240, proc, "checkpoint step-1")
        # A second job on the same --out (a resume while the run is alive) is refused before it touches anything.
        second = subprocess.run(
            [sys.executable, "-m", "agentbolt.cli.main", "train", str(config_path), "--out", str(out), "--resume"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"in use by another agentbolt job (pid {proc.pid}: agentbolt train" in " ".join(second.stderr.split())
        # in the middle of step 2: its rollouts are enqueued and at least one is running
        _wait_for(
            lambda: (
                _rows(
                    db,
                    "SELECT COUNT(*) FROM rollouts WHERE status = 'running' "
                    "AND json_extract(metadata, '$.train_step') = 2",
                )[0][0]
                > 0
            ),
            120,
            proc,
            "a running rollout of step 2",
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        hold.unlink()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "checkpoints" / "step-2").exists()
    open_before = _rows(db, "SELECT COUNT(*) FROM rollouts WHERE status NOT IN ('succeeded', 'failed', 'cancelled')")
    assert open_before[0][0] > 0, "the killed run should leave unfinished rollouts behind"
    info1 = read_checkpoint(out / "checkpoints" / "step-1")
    assert info1.step == 1 and info1.model_version == "step-1"
    saved_adapter = load_file(str(info1.path / "adapter_model.safetensors"))
    saved_state = torch.load(info1.path / "trainer_state.pt", weights_only=True)
    assert saved_state["train_steps"] == 1 and saved_state["optimizer"]["state"], "AdamW never stepped in step 1"

    # checkpoints cut short: a temporary folder and a step folder without checkpoint.json
    (out / "checkpoints" / ".tmp-step-2-99999").mkdir()
    (out / "checkpoints" / "step-7").mkdir()
    (out / "checkpoints" / "step-7" / "adapter_model.safetensors").write_bytes(b"cut")
    assert latest_checkpoint(out).step == 1  # type: ignore[union-attr]

    # the state the resumed trainer holds right after loading the checkpoint
    loaded: dict[str, Any] = {}
    real_load = TorchPolicyTrainer.load_state

    def spy_load(self: TorchPolicyTrainer, directory: str | Path) -> None:
        real_load(self, directory)
        loaded["adapter"] = {k: v.detach().clone() for k, v in self.model.state_dict().items() if "lora_" in k}
        loaded["optimizer"] = copy.deepcopy(self.optimizer.state_dict())  # later steps update it in place
        loaded["train_steps"] = self.train_steps

    monkeypatch.setattr(TorchPolicyTrainer, "load_state", spy_load)
    monkeypatch.setenv("AGENTBOLT_CACHE", str(cache))
    monkeypatch.chdir(REPO)
    time.sleep(12)  # the killed run's runner processes exit 10 s after their parent died
    config = load_train_config(config_path, [f"out_dir={out}", "resume=true"])
    summary = asyncio.run(run_training(config))

    # adapter and optimizer state at load equal the checkpoint's, exactly
    assert loaded["train_steps"] == 1
    assert len(loaded["adapter"]) == len(saved_adapter)
    for name, tensor in saved_adapter.items():
        live = next(v for k, v in loaded["adapter"].items() if k.replace(".default", "") == name)
        assert torch.equal(live, tensor), name
    assert loaded["optimizer"]["param_groups"] == saved_state["optimizer"]["param_groups"]
    assert loaded["optimizer"]["state"].keys() == saved_state["optimizer"]["state"].keys()
    for index, moments in saved_state["optimizer"]["state"].items():
        for key, value in moments.items():
            assert torch.equal(loaded["optimizer"]["state"][index][key], value), (index, key)

    # steps continue at 2; each step appears once
    assert summary["resumed_from_step"] == 1
    assert summary["step_numbers"] == [1, 2, 3]
    per_step = _rows(db, "SELECT train_step, COUNT(*) FROM metrics WHERE name = 'train_reward_mean' GROUP BY 1")
    assert per_step == [(1, 1), (2, 1), (3, 1)]
    assert json.loads((out / "summary.json").read_text())["step_numbers"] == [1, 2, 3]
    enqueued = _rows(db, "SELECT json_extract(metadata, '$.train_step'), COUNT(*) FROM rollouts GROUP BY 1 ORDER BY 1")
    assert enqueued[0] == (1, 8) and enqueued[-1] == (3, 8)  # step 1 never ran again; step 2 twice (killed + resumed)
    assert _rows(db, "SELECT COUNT(*) FROM rollouts WHERE status NOT IN ('succeeded', 'failed', 'cancelled')") == [(0,)]
    assert _rows(db, "SELECT COUNT(*) FROM rollouts WHERE status = 'cancelled'")[0][0] == open_before[0][0]

    # partial folders are gone; every step has a complete checkpoint
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert names == ["step-1", "step-2", "step-3"]
    final = read_checkpoint(out / "checkpoints" / "step-3")
    assert final.loop["versions"] == ["base", "step-1", "step-2", "step-3"]

    # each checkpoint is a resources version; the train rollouts of step 3 ran on step-2's weights and say so
    published = {
        json.loads(meta)["train_step"]: json.loads(meta)["checkpoint"]
        for (meta,) in _rows(db, "SELECT metadata FROM resources")
        if json.loads(meta).get("purpose") == "checkpoint"
    }
    assert published == {n: str((out / "checkpoints" / f"step-{n}").resolve()) for n in (1, 2, 3)}
    step3_resources = _rows(
        db,
        "SELECT DISTINCT r.metadata FROM rollouts o JOIN resources r ON r.resources_id = o.resources_id "
        "WHERE json_extract(o.metadata, '$.train_step') = 3",
    )
    assert [json.loads(m)["checkpoint"] for (m,) in step3_resources] == [published[2]]


def test_checkpoint_adapter_loads_with_plain_peft(tmp_path: Path, smollm2_dir: Path) -> None:
    """The adapter files of a checkpoint written by ``TorchPolicyTrainer.save_state`` load with peft's own API and
    reproduce the trained LoRA weights."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from agentbolt.algorithms.rl.torch_backend import TorchPolicyTrainer, TorchTrainerConfig, attach_lora

    config = TorchTrainerConfig(lora_r=4, lora_alpha=8, lora_target_modules=("q_proj", "v_proj"))
    policy = attach_lora(AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.bfloat16), config)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.01)
    trainer = TorchPolicyTrainer(policy, config, pad_token_id=0)
    trainer.save_state(tmp_path / "ck")
    assert (tmp_path / "ck" / "trainer_state.pt").is_file()
    plain = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.bfloat16), tmp_path / "ck"
    )
    ours = {k: v for k, v in policy.state_dict().items() if "lora_" in k}
    theirs = {k: v for k, v in plain.state_dict().items() if "lora_" in k}
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k].to(ours[k].dtype)) for k in ours)


def test_eval_checkpoint_reproduces_the_after_accuracy(tmp_path: Path, smollm2_dir: Path) -> None:
    """``agentbolt eval CONFIG --checkpoint`` in a fresh process scores the last checkpoint as the train job's "after"
    evaluation did (greedy, same settings), and refuses a prompt-optimization option on an RL config."""
    config_path = tmp_path / "config.yaml"
    config_path.write_text(
        CONFIG.replace("val_size: 0", "val_size: 2\neval_before: false").replace("steps: 3", "steps: 1")
    )
    out = tmp_path / "run"
    env = {**os.environ, "AGENTBOLT_CACHE": str(smollm2_dir.parent.parent), "COLUMNS": "200"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "agentbolt.cli.main", *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    trained = cli("train", str(config_path), "--out", str(out))
    assert trained.returncode == 0, trained.stdout + trained.stderr
    after = json.loads((out / "summary.json").read_text())["val_accuracy_after"]
    assert set(after) == {"lengths"}
    checkpoint = out / "checkpoints" / "step-1"
    scored = cli("eval", str(config_path), "--checkpoint", str(checkpoint), "--split", "val")
    assert scored.returncode == 0, scored.stdout + scored.stderr
    result = json.loads((out / "eval-step-1-val" / "eval.json").read_text())
    assert result["accuracy"] == after
    assert result["model_version"] == "step-1" and result["step"] == 1 and result["n_tasks"] == {"lengths": 2}
    assert "val accuracy of step-1" in scored.stdout

    again = cli("eval", str(config_path), "--checkpoint", str(checkpoint))
    assert again.returncode == 2 and "--overwrite" in again.stdout + again.stderr
    assert "--resume" not in again.stdout + again.stderr  # eval has no --resume

    # A truncated adapter (a copy cut short) is named by eval, serve and export-model before any model loads, and
    # leaves no output folder behind.
    damaged = tmp_path / "damaged" / "step-1"
    shutil.copytree(checkpoint, damaged)
    weights = damaged / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    for args in (
        ("eval", str(config_path), "--checkpoint", str(damaged)),
        ("serve", "--store", f"sqlite:///{tmp_path / 'serve.db'}", "--adapter", str(damaged)),
        ("export-model", str(damaged), "--out", str(tmp_path / "exported")),
    ):
        refused = cli(*args)
        text = " ".join((refused.stdout + refused.stderr).split())
        assert refused.returncode == 2 and f"the LoRA adapter in {damaged} is damaged" in text, text
        assert "Traceback" not in text
    assert not (tmp_path / "damaged" / "eval-step-1-val").exists() and not (tmp_path / "exported").exists()
    assert not list(tmp_path.glob(".tmp-exported-*"))
    wrong = cli("eval", str(config_path), "--resources", "rs-1")
    assert wrong.returncode == 2 and "--checkpoint OUT/checkpoints/step-N" in wrong.stdout + wrong.stderr


def test_a_damaged_checkpoint_is_named(tmp_path: Path, smollm2_dir: Path) -> None:
    """A truncated adapter or trainer state (a disk filled up, a copy cut short) is a ConfigError that says to delete
    the folder, never a deserializer traceback."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentbolt.algorithms.rl.torch_backend import TorchPolicyTrainer, TorchTrainerConfig, attach_lora
    from agentbolt.errors import ConfigError

    config = TorchTrainerConfig(lora_r=4, lora_alpha=8, lora_target_modules=("q_proj",))
    policy = attach_lora(AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.bfloat16), config)
    trainer = TorchPolicyTrainer(policy, config, pad_token_id=0)
    for name in ("adapter_model.safetensors", "trainer_state.pt"):
        folder = tmp_path / name
        trainer.save_state(folder)
        target = folder / name
        target.write_bytes(target.read_bytes()[:100])
        with pytest.raises(ConfigError, match="damaged.*delete that folder"):
            trainer.load_state(folder)


def test_ctrl_c_stops_the_job_cleanly_and_names_the_resume_command(tmp_path: Path, smollm2_dir: Path) -> None:
    """Ctrl-C in a terminal sends SIGINT to the whole process group (the job and its runner processes): the job
    stops within 2 s with exit code 130 and prints the command that resumes it; no process prints a traceback; the
    in-flight rollouts end ``cancelled`` (none is left open) and ``summary.json`` holds the finished steps (none)."""
    config_path = tmp_path / "config.yaml"
    config_path.write_text(CONFIG)
    out = tmp_path / "run"
    env = {**os.environ, "AGENTBOLT_CACHE": str(smollm2_dir.parent.parent), "COLUMNS": "300"}
    proc = _start_train(config_path, out, env, start_new_session=True)  # its own process group, as in a terminal
    try:
        _wait_for(
            lambda: _rows(out / "store.db", "SELECT COUNT(*) FROM rollouts WHERE status = 'running'")[0][0] > 0,
            240,
            proc,
            "a running rollout",
        )
        t_signal = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
        stop_s = time.monotonic() - t_signal
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = output.decode()
    assert proc.returncode == 130, text
    assert stop_s < 2.0, (stop_s, text)
    assert "Traceback" not in text and "KeyboardInterrupt" not in text and "leaked semaphore" not in text, text
    assert f"--out {out} --resume" in " ".join(text.split())
    by_status = dict(_rows(out / "store.db", "SELECT status, COUNT(*) FROM rollouts GROUP BY status"))
    assert by_status.get("cancelled", 0) >= 1, by_status  # the one seen running, at least
    assert set(by_status) <= {"cancelled", "succeeded", "failed"}, by_status  # none left queuing or running
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped"] is True and summary["step_numbers"] == [] and summary["n_rollouts"] == 8
    assert summary["rollouts_cancelled"] == by_status["cancelled"]
    assert "unfinished rollouts cancelled" in text
