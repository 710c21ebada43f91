"""What the update trained on is what the dashboard and ``agentbolt export --kind rl`` show (issue 20, item 6).

One real training step on SmolLM2-135M (the embedded model, a SQLite store, the server, a runner process) with
``advantage_estimator: rloo`` and ``credit_assignment: discounted``, 2 tasks x group 2, an agent that makes two
calls per rollout (:mod:`two_call_agent`). The real torch updater is wrapped to keep the samples it receives. Then:

- the dashboard API (over HTTP, from the real server) shows, per transition, exactly the advantage and loss mask of
  the sample that held the call in the update's batch, and the reward discounted credit gave it (``0.5 R`` for the
  first call, ``R`` for the second), labelled ``advantage_source: "trained"`` with rloo and discounted;
- ``agentbolt export --kind rl`` writes those samples back, equal to what the update received.

Without the record, both recomputed GRPO with ``broadcast`` credit: the two calls of a rollout would show one
advantage and one reward, and not rloo's values.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentbolt.adapter.samples import TrainingSample
from agentbolt.cli.export import ExportConfig, load_rl_samples, run_export
from agentbolt.config import GRPOConfig
from agentbolt.trainer.loop import StepResult

pytestmark = pytest.mark.slow
AGENT = "tests.integration.two_call_agent:two_call_agent"
TASKS = [{"task_id": "color", "question": "Name a color."}, {"task_id": "fruit", "question": "Name a fruit."}]


class RecordingUpdater:
    """The real trainer backend, keeping every batch it is given."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.batches: list[list[TrainingSample]] = []

    def train_step(self, samples: list[TrainingSample]) -> dict[str, float]:
        self.batches.append(list(samples))
        return self.inner.train_step(samples)


def test_dashboard_and_export_show_the_advantages_the_update_used(tmp_path: Path, smollm2_dir: Path) -> None:
    from agentbolt.trainer.local import LocalMachine, local_training

    grpo = GRPOConfig(
        steps=1,
        tasks_per_step=2,
        group_size=2,
        max_tokens=6,
        advantage_estimator="rloo",
        credit_assignment="discounted",
        credit_gamma=0.5,
    )
    db = tmp_path / "store.db"

    async def scenario() -> tuple[StepResult, RecordingUpdater, dict[str, list[dict[str, Any]]]]:
        machine = LocalMachine(model=smollm2_dir, agent=AGENT, runner_processes=1, runner_concurrency=4)
        async with local_training(machine, db_path=db, grpo=grpo) as local:
            recorder = RecordingUpdater(local.trainer.updater)
            local.trainer.updater = recorder
            result = await local.trainer.train_step(1, TASKS)
            views: dict[str, list[dict[str, Any]]] = {}
            async with httpx.AsyncClient(base_url=local.url, timeout=60) as client:
                for rollout in await local.store.query_rollouts():
                    resp = await client.get(f"/v1/rollouts/{rollout.rollout_id}/transitions")
                    assert resp.status_code == 200, resp.text
                    views[rollout.rollout_id] = resp.json()
        return result, recorder, views

    result, recorder, views = asyncio.run(scenario())
    assert result.n_rollouts == 4 and result.n_failed == 0 and len(recorder.batches) == 1
    [batch] = recorder.batches

    # What the update received, per call (span): its sample's advantage and the loss mask over its response.
    expected: dict[str, tuple[float | None, list[int]]] = {}
    for sample in batch:
        for call in sample.calls:
            assert call.span_id is not None
            mask = sample.loss_mask[call.response_start : call.response_end]
            expected[call.span_id] = (sample.advantage if any(mask) else None, mask)
    shown = [t for transitions in views.values() for t in transitions]
    assert len(shown) == 8 and {t["span_id"] for t in shown} == set(expected)  # 4 rollouts x 2 calls, all trained
    for t in shown:
        advantage, mask = expected[t["span_id"]]
        assert t["advantage"] == advantage, t["span_id"]  # exactly: the same float, not a recomputation
        assert [r["loss_mask"] for r in t["response"]] == mask
        assert (t["advantage_source"], t["advantage_estimator"], t["credit_assignment"], t["train_step"]) == (
            "trained",
            "rloo",
            "discounted",
            1,
        )
    for rollout_id, (first, second) in ((rid, v) for rid, v in views.items()):
        # discounted credit (gamma 0.5, two turns): the first call gets half the outcome; every outcome is > 0
        assert second["reward"] > 0 and first["reward"] == pytest.approx(0.5 * second["reward"]), rollout_id
        assert first["advantage"] != second["advantage"], rollout_id  # broadcast would give one value

    # agentbolt export --kind rl (default: the recorded samples) writes the batch the update received.
    out = tmp_path / "rl.jsonl"
    n_rows = asyncio.run(run_export(ExportConfig(store=str(db), kind="rl", out=out)))
    assert n_rows == len(batch) and load_rl_samples(out) == batch
