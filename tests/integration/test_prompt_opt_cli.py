"""``agentbolt train examples/room_agent/config.yaml`` (APO) end to end on this machine: SmolLM2-135M as the agent
(embedded model, runner process, server, SQLite store) and a second embedded SmolLM2-135M loaded by the job as the
optimizer (``optimizer_model``), on a few room tasks."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from examples.room_agent.agent import MAX_TOOL_CALLS
from typer.testing import CliRunner

from agentbolt.cli.main import app
from agentbolt.store import SqliteLightningStore

REPO = Path(__file__).resolve().parents[2]


def test_apo_job_with_a_second_embedded_model_as_the_optimizer(
    smollm2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)  # examples.* import from the repository root (runner processes inherit sys.path)
    out = tmp_path / "apo"
    settings = [
        f"model={smollm2_dir}",
        f"optimizer_model={smollm2_dir}",
        f"optimizer.cache_dir={tmp_path / 'cache'}",
        "optimizer.max_tokens=24",
        "train_size=2",
        "val_size=2",
        "eval_test=false",
        "apo.rounds=1",
        "apo.beam_width=1",
        "apo.branch_factor=1",
        "apo.train_batch_size=2",
        "apo.worst_k=1",
        "runner_processes=1",
        "runner_concurrency=2",
        "max_attempts=1",
        "agent_max_tokens=8",
        "rollout_timeout_s=300",
    ]
    args = ["train", "examples/room_agent/config.yaml", "--out", str(out)]
    for item in settings:
        args += ["--set", item]
    result = CliRunner().invoke(app, args, env={**os.environ, "COLUMNS": "200"})
    assert result.exit_code == 0, result.output

    summary = json.loads((out / "summary.json").read_text())
    assert summary["optimizer_embedded_model"] == str(smollm2_dir)
    assert summary["optimizer_base_url"] == "embedded"
    assert summary["timing_s"]["optimizer_model_setup"] > 0
    # one critique and one edit; the agent's model served at most MAX_TOOL_CALLS + 1 LLM calls per rollout
    assert summary["optimizer_calls"] == 2 and summary["optimizer_cache_hits"] == 0
    n_candidates = len(summary["candidates"])
    assert summary["rollouts"]["optimization"] == 2 + 2 + 2 * (n_candidates - 1)
    assert summary["generation"]["requests"] <= (MAX_TOOL_CALLS + 1) * summary["rollouts"]["optimization"]
    assert (out / "best_prompt.prompt_template.txt").read_text() == summary["best_prompts"]["prompt_template"]

    async def versions() -> list[str]:
        store = SqliteLightningStore(out / "store.db")
        try:
            return [version.resources_id for version in await store.query_resources()]
        finally:
            await store.close()

    assert len(asyncio.run(versions())) == n_candidates  # one resources version per candidate
