"""The server side of training data (the dashboard's transitions route, ``agentbolt export --kind rl``) must work with
the ``[server]`` extra alone: torch, transformers and peft cannot even be imported in the subprocess below, and any
attempt to import them (swallowed ``ImportError`` included) fails the test. The adapter's batch code (selection,
credit, advantages, samples, rows) is what both paths run, so this pins that it stays torch-free and below the server.

The store is a SQLite file filled through the store API: two train rollouts of one task (rewards 1 and 0, one gateway
LLM call each, never recorded by a trainer, so the rows are recomputed: GRPO over {1, 0} gives +-0.7071) and one of
another task whose step a trainer recorded (its advantage 0.375 comes back as recorded).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REFUSED = ("torch", "transformers", "peft")
"""Top-level packages the subprocess cannot import."""

CHILD = textwrap.dedent(
    """
    import sys

    REFUSED = {refused!r}
    attempts = []


    class Refuse:
        '''Refuses (and records) every import of a refused package, before any other finder sees it.'''

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in REFUSED:
                attempts.append(name)
                raise ModuleNotFoundError(f"{{name}} is refused in this test", name=name)
            return None


    sys.meta_path.insert(0, Refuse())

    import asyncio
    import json
    import runpy
    import time
    from pathlib import Path

    import httpx

    from agentbolt import semconv
    from agentbolt.server.app import create_app
    from agentbolt.server.serving import serve_in_background
    from agentbolt.store import SqliteLightningStore
    from agentbolt.types import AttemptStatus, RolloutConfig, Span, TrainedCall, TrainedSample

    db = Path(sys.argv[1]) / "store.db"
    out = Path(sys.argv[1]) / "rows.jsonl"


    def llm_span(rollout_id, attempt_id, span_id):
        now = time.time()
        return Span(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            span_id=span_id,
            trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
            name=semconv.SPAN_LLM_CALL,
            start_time=now,
            end_time=now,
            attributes={{
                semconv.LLM_PROMPT_TOKEN_IDS: [1, 2, 3],
                semconv.LLM_RESPONSE_TOKEN_IDS: [4, 5],
                semconv.LLM_RESPONSE_LOGPROBS: [-0.5, -0.25],
            }},
        )


    async def fill_and_serve():
        store = SqliteLightningStore(db)
        ids = []
        try:
            for i, (task_id, reward) in enumerate([("t1", 1.0), ("t1", 0.0), ("t2", 1.0)]):
                metadata = {{"task_id": task_id, "train_step": i // 2}}
                config = RolloutConfig(max_attempts=1)
                rollout = await store.enqueue_rollout({{"q": i}}, config=config, metadata=metadata)
                claimed = await store.claim_rollout("w-1")
                rid, aid = rollout.rollout_id, claimed.attempt.attempt_id
                await store.update_attempt(rid, aid, AttemptStatus.RUNNING)
                await store.add_span(llm_span(rid, aid, f"00000000000000a{{i}}"))
                await store.update_attempt(rid, aid, AttemptStatus.SUCCEEDED, final_reward=reward)
                ids.append((rid, aid))
            recorded = TrainedSample(
                train_step=1,
                sample_index=0,
                rollout_id=ids[2][0],
                attempt_id=ids[2][1],
                calls=[TrainedCall(span_id="00000000000000a2", response_start=3, response_end=5, reward=1.0)],
                loss_mask_ranges=[(3, 5)],
                advantage=0.375,
                advantage_estimator="rloo",
                credit_assignment="broadcast",
            )
            await store.put_trained_samples(1, [recorded])
            async with serve_in_background(create_app(store)) as url, httpx.AsyncClient(base_url=url) as client:
                shown = []
                for rid, _ in ids:
                    response = await client.get(f"/v1/rollouts/{{rid}}/transitions")
                    assert response.status_code == 200, response.text
                    shown.append([(t["advantage"], t["advantage_source"]) for t in response.json()])
            return shown
        finally:
            await store.close()


    transitions = asyncio.run(fill_and_serve())

    sys.argv = ["agentbolt", "export", "--store", str(db), "--kind", "rl", "--out", str(out)]
    try:
        runpy.run_module("agentbolt.cli.main", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []

    loaded = sorted(m for m in sys.modules if m.split(".")[0] in REFUSED and sys.modules[m] is not None)
    print(json.dumps({{
        "transitions": transitions,
        "export_exit_code": code,
        "rows": [(r["rollout_id"], r["advantage"], r["advantage_source"]) for r in rows],
        "attempts": sorted(set(attempts)),
        "loaded": loaded,
        "trainer_loaded": "agentbolt.trainer" in sys.modules,
        "rl_algorithms_loaded": "agentbolt.algorithms.rl" in sys.modules,
    }}))
    """
).format(refused=REFUSED)


def test_dashboard_and_rl_export_never_import_torch(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, check=False, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["attempts"] == [], f"tried to import {report['attempts']}"
    assert report["loaded"] == [] and not report["trainer_loaded"] and not report["rl_algorithms_loaded"], report

    t1_high, t1_low, t2 = report["transitions"]
    # GRPO over the group {1, 0}: mean 0.5, sample std sqrt(0.5) -> advantages +-0.5 / 0.7071 = +-0.7071
    assert t1_high[0][0] == pytest.approx(0.70711, abs=1e-4) and t1_high[0][1] == "recomputed"
    assert t1_low[0][0] == pytest.approx(-0.70711, abs=1e-4) and t1_low[0][1] == "recomputed"
    assert t2 == [[0.375, "trained"]]

    assert report["export_exit_code"] == 0
    rows = sorted(report["rows"], key=lambda r: r[1])
    assert [(round(a, 4), source) for _, a, source in rows] == [
        (-0.7071, "recomputed"),
        (0.375, "trained"),
        (0.7071, "recomputed"),
    ]
