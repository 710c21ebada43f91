"""``agentbolt train`` checks its tasks before the model loads, and a run that fails early leaves nothing behind.

Pinned, with the real CLI as a child process:
- a task that is not a JSON object stops the job with exit code 2 and one short message naming where it is (the
  file and line of a JSON Lines tasks file given in the config; the module, function and index of a tasks module),
  within seconds (no model is loaded), and writes no store;
- a run that fails after its store was created but before any rollout ended (its runner processes die as they
  start) removes that store, so the same command can be rerun without ``--overwrite``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CONFIG = """\
model: {model}
agent: examples.calc_agent.agent:calc_agent
tasks: {tasks}
train_size: 8
val_size: 2
grpo:
  steps: 1
  tasks_per_step: 1
  group_size: 2
"""


def _train(config: Path, out: Path, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    """Run ``agentbolt train CONFIG --out OUT`` from ``cwd``; return its exit code, its output (one line per line,
    whitespace squeezed) and its wall time."""
    env = {**os.environ, "COLUMNS": "300", **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "agentbolt.cli.main", "train", str(config), "--out", str(out)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stdout + done.stderr, time.monotonic() - t0


def _not_a_model(tmp_path: Path) -> Path:
    """A folder that is not a model: a job that got as far as loading it would fail there (never reached here)."""
    folder = tmp_path / "not-a-model"
    folder.mkdir()
    return folder


def test_a_bad_row_of_a_jsonl_tasks_file_is_named_by_line_before_the_model_loads(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"question": "1 + 1", "answer": "2"}\n\n"what is 2 + 2?"\n{"question": "3 + 3"}\n')
    config = tmp_path / "job.yaml"
    config.write_text(CONFIG.format(model=_not_a_model(tmp_path), tasks=tasks))
    out = tmp_path / "out"
    rc, text, wall_s = _train(config, out, cwd=REPO)
    assert rc == 2, text
    assert f"{tasks}:3: a task must be a JSON object, got a string" in " ".join(text.split()), text
    assert "Traceback" not in text and len(text.strip().splitlines()) <= 3, text
    assert wall_s < 60, f"{wall_s:.0f}s: the tasks were checked late"
    assert not (out / "store.db").exists()

    # invalid JSON names its line too; a good file goes past the tasks (to the model, which is not one here)
    tasks.write_text('{"question": "1 + 1"}\n{"question": \n')
    rc, text, _ = _train(config, out, cwd=REPO)
    assert rc == 2 and f"{tasks}:2: not valid JSON" in " ".join(text.split()), text
    tasks.write_text('{"question": "1 + 1"}\n{"question": "2 + 2"}\n')
    rc, text, _ = _train(config, out, cwd=REPO)
    assert rc != 0 and "loading the model from" in text and "tasks/step=1" in text, text


def test_a_bad_row_of_a_tasks_module_is_named_before_the_model_loads(tmp_path: Path) -> None:
    (tmp_path / "my_tasks.py").write_text(
        "def load_train_tasks(size):\n"
        "    return [{'question': '1 + 1'}, ['not', 'a', 'task'], {'question': '2 + 2'}][:size]\n\n"
        "def load_val_sets(n_per_set):\n"
        "    return {'v': [{'question': '3 + 3'}]}\n"
    )
    config = tmp_path / "job.yaml"
    config.write_text(CONFIG.format(model=_not_a_model(tmp_path), tasks="my_tasks"))
    out = tmp_path / "out"
    rc, text, wall_s = _train(config, out, cwd=tmp_path)
    flat = " ".join(text.split())
    assert rc == 2, text
    assert "tasks module 'my_tasks' load_train_tasks(): item 1 is a list" in flat, text
    assert "Traceback" not in text and len(text.strip().splitlines()) <= 3, text
    assert wall_s < 60 and not (out / "store.db").exists()


@pytest.mark.slow
def test_a_run_that_failed_before_any_rollout_ended_removes_its_store(tmp_path: Path, smollm2_dir: Path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(
        CONFIG.format(model="smollm2-135m", tasks="tests.integration.runner_crash_agent").replace(
            "examples.calc_agent.agent:calc_agent", "tests.integration.runner_crash_agent:agent"
        )
        + "runner_processes: 1\n"
    )
    out = tmp_path / "out"
    rc, text, _ = _train(config, out, cwd=REPO, env={"AGENTBOLT_CACHE": str(smollm2_dir.parent.parent)})
    flat = " ".join(text.split())
    assert rc == 1 and "every runner process exited" in flat, text  # the job ran and failed: 1, not a usage error
    assert f"removed {out / 'store.db'}" in flat, text
    left = sorted(p.name for p in out.iterdir() if p.name.startswith("store.db"))
    assert left == [], f"the failed run left {left}: a rerun without --overwrite would be refused"
