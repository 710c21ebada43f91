"""``agentbolt eval`` end to end: SmolLM2-135M (real embedded model, runner process, server) on two room tasks,
against a store holding a resources version whose ``llm`` points at a server that is gone."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentbolt.cli.main import app
from agentbolt.store import RolloutSearch, SqliteLightningStore
from agentbolt.types import LLM, PromptTemplate, RolloutMode, RolloutStatus

REPO = Path(__file__).resolve().parents[2]


def test_eval_runs_a_stored_version_on_val_tasks(
    smollm2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from examples.room_agent.agent import BASELINE_PROMPT

    db = tmp_path / "store.db"

    async def seed() -> None:
        store = SqliteLightningStore(db)
        try:
            await store.add_resources({"prompt_template": PromptTemplate(template="unused")})  # rs-1
            llm = LLM(endpoint="http://127.0.0.1:9", model="old-model", sampling_parameters={"max_tokens": 8})
            await store.add_resources({"llm": llm, "prompt_template": PromptTemplate(template=BASELINE_PROMPT)})
        finally:
            await store.close()

    asyncio.run(seed())
    monkeypatch.chdir(REPO)  # examples.* import from the repository root (runner processes inherit sys.path)
    out = tmp_path / "eval"
    settings = [
        f"model={smollm2_dir}",
        "val_size=2",
        "runner_processes=1",
        "runner_concurrency=2",
        "max_attempts=1",
        "agent_max_tokens=8",
        "rollout_timeout_s=120",
    ]
    args = ["eval", "examples/room_agent/config.yaml", "--resources", "rs-2", "--split", "val"]
    args += ["--store", str(db), "--out", str(out)]
    for item in settings:
        args += ["--set", item]
    result = CliRunner().invoke(app, args, env={**os.environ, "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "published rs-3" in result.output and "accuracy" in result.output

    summary = json.loads((out / "eval.json").read_text())

    async def check() -> None:
        store = SqliteLightningStore(db)
        try:
            version = await store.get_resources("rs-3")
            assert version is not None and version.metadata == {"eval_of": "rs-2"}
            assert version.resources["prompt_template"] == PromptTemplate(template=BASELINE_PROMPT)
            llm = version.resources["llm"]
            assert isinstance(llm, LLM) and llm.endpoint.startswith("http://127.0.0.1:") and llm.model != "old-model"
            assert llm.sampling_parameters == {"max_tokens": 8}  # kept from rs-2
            rollouts, total = await store.search_rollouts(RolloutSearch(resources_id="rs-3"))
            assert total == 2
            assert all(r.mode is RolloutMode.VAL and r.metadata["eval_of"] == "rs-2" for r in rollouts)
            assert all(r.status in (RolloutStatus.SUCCEEDED, RolloutStatus.FAILED) for r in rollouts)
            assert sorted(r.rollout_id for r in rollouts) == sorted(x["rollout_id"] for x in summary["results"])
            rewards = {r.rollout_id: r.final_reward or 0.0 for r in rollouts}
            assert {x["rollout_id"]: x["reward"] for x in summary["results"]} == rewards
            stats = [s for s in await store.reward_stats() if s.resources_id == "rs-3"]
            assert [(s.mode, s.n) for s in stats] == [(RolloutMode.VAL, 2)]
            # the evaluator scores a rollout without a reward 0; the store's mean leaves it out
            assert summary["mean_reward"] == pytest.approx((stats[0].mean_reward or 0.0) * stats[0].n_with_reward / 2)
        finally:
            await store.close()

    asyncio.run(check())
    assert summary["resources_id"] == "rs-2" and summary["eval_resources_id"] == "rs-3"
    assert summary["split"] == "val" and summary["mode"] == "val" and summary["n"] == 2
    assert summary["n_correct"] == sum(x["reward"] >= 1.0 for x in summary["results"])
    assert summary["accuracy"] == summary["n_correct"] / 2
