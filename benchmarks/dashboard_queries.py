"""Dashboard API latency on a 100k-rollout SQLite store (``python benchmarks/dashboard_queries.py [--rollouts N]``).

Fill (documented direct path, not the store API): rows are written straight into a store file migrated by
:class:`~agentbolt.store.SqliteLightningStore`, with the column order of :mod:`agentbolt.store.tables` and JSON encoded
as the store encodes it; 11 spans per started rollout (3 gateway LLM calls with token ids and logprobs, 3 tool calls, an
exception on failures, a reward), inputs shaped like the calc and room tasks of ``examples/``. Then the real server
(uvicorn on 127.0.0.1) is started over that file and each query is timed end to end with httpx, 20 requests each
(3 for the scores and the error summary); ``--only scores`` times only the queries whose label contains ``scores``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store import SqliteLightningStore, tables
from agentbolt.store import sqlite_schema as schema

CONFIG = json.dumps({"max_attempts": 1})


def _input(i: int, rng: random.Random) -> dict[str, object]:
    if i % 2:
        a, b = rng.randint(1, 999), rng.randint(1, 999)
        return {"task_id": f"calc-{i % 500}", "question": f"What is {a} * {b}?", "answer": a * b}
    people = rng.randint(1, 8)
    return {
        "task_id": f"room-{i % 500}",
        "question": f"Book a room for {people} people on day {rng.randint(1, 30)} with a whiteboard",
        "rooms": [{"id": f"R{k}", "capacity": k * 2, "whiteboard": k % 2 == 0} for k in range(1, 5)],
    }


def fill(path: Path, n_rollouts: int, seed: int = 0) -> int:
    """Write ``n_rollouts`` rollouts (1 attempt each, 11 spans per started one) into a migrated store file."""
    rng = random.Random(seed)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    schema.migrate(conn)
    now = time.time() - n_rollouts * 0.5
    conn.execute("BEGIN")
    conn.execute(
        "INSERT INTO resources (version, resources_id, resources, create_time, metadata) VALUES "
        + ", ".join(f"({v}, 'rs-{v}', '{{}}', {now}, '{{}}')" for v in range(1, 11))
    )
    r_sql = (
        f"INSERT INTO rollouts ({', '.join(tables.ROLLOUTS.columns)}) VALUES ({schema.marks(tables.ROLLOUTS.columns)})"
    )
    a_sql = (
        f"INSERT INTO attempts ({', '.join(tables.ATTEMPTS.columns)}) VALUES ({schema.marks(tables.ATTEMPTS.columns)})"
    )
    s_sql = f"INSERT INTO spans ({', '.join(tables.SPANS.columns)}) VALUES ({schema.marks(tables.SPANS.columns)})"
    rows_r, rows_a, rows_s = [], [], []
    for i in range(n_rollouts):
        t = now + i * 0.5
        rid, aid = f"ro-{i:08d}", f"at-{i:08d}"
        task = _input(i, rng)
        roll = rng.random()
        status = "succeeded" if roll < 0.7 else "failed" if roll < 0.95 else "queuing"
        mode = "val" if i % 10 == 0 else "train"
        reward = rng.choice([0.0, 0.0, 0.5, 1.0]) if status == "succeeded" else None
        meta = json.dumps({"task_id": task["task_id"], "train_step": i // 1000})
        rs = f"rs-{1 + i // (n_rollouts // 10 or 1) % 10}"
        running = status != "queuing"
        rows_r.append(
            (
                rid,
                json.dumps(task),
                mode,
                rs,
                status,
                CONFIG,
                meta,
                t,
                t + 1 if running else None,
                t + 20 if running else None,
                1 if running else 0,
                reward,
            )
        )
        if not running:
            continue
        a_status = status if roll < 0.9 else "timeout"
        error = (
            json.dumps({"type": rng.choice(["KeyError", "ValueError"]), "message": "bad"})
            if a_status == "failed"
            else None
        )
        rows_a.append((aid, rid, 1, a_status, "w-1", rs, t + 1, t + 20, t + 20, error))
        for k in range(11):
            if k in (0, 3, 6):
                prompt = [rng.randrange(50_000) for _ in range(24)]
                resp = [rng.randrange(50_000) for _ in range(8)]
                attrs = {
                    "agentbolt.llm.prompt_token_ids": prompt,
                    "agentbolt.llm.response_token_ids": resp,
                    "agentbolt.llm.response_logprobs": [-0.1] * 8,
                    "agentbolt.llm.model_version": "step-0",
                    "gen_ai.response.finish_reasons": ["stop"],
                }
                name = "agentbolt.llm_call"
            elif k in (1, 4, 7):
                name, attrs = "tool", {"openinference.span.kind": "TOOL", "tool.name": "calculator"}
            elif k == 9 and reward is not None:
                name, attrs = "agentbolt.reward", {"agentbolt.reward.value": reward}
            elif k == 9 and a_status == "failed":
                name, attrs = "agentbolt.exception", {"exception.type": "KeyError", "exception.message": "x"}
            elif k == 10:
                name, attrs = "agentbolt.message", {"agentbolt.message.body": "done"}
            else:
                name, attrs = "agentbolt.operation", {"agentbolt.operation.name": "step"}
            rows_s.append(
                (
                    rid,
                    aid,
                    k + 1,
                    f"{i:08x}{k:08x}",
                    f"{i:032x}",
                    None,
                    name,
                    t + k,
                    t + k + 0.5,
                    json.dumps(attrs),
                    '{"code":"UNSET"}',
                )
            )
        if len(rows_s) > 100_000:
            conn.executemany(s_sql, rows_s)
            rows_s.clear()
    conn.executemany(r_sql, rows_r)
    conn.executemany(a_sql, rows_a)
    conn.executemany(s_sql, rows_s)
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    (n_spans,) = conn.execute("SELECT count(*) FROM spans").fetchone()
    conn.close()
    return int(n_spans)


async def measure(path: Path, n_rollouts: int, repeats: int, only: str | None = None) -> list[tuple[str, float, float]]:
    store = SqliteLightningStore(path)
    sample_id = f"ro-{(n_rollouts // 2) | 1:08d}"
    queries = {
        "search: first page": "/v1/rollouts/search?limit=50&descending=true",
        "search: status=succeeded,failed": "/v1/rollouts/search?status=succeeded,failed&limit=50&descending=true",
        "search: reward 0.5..1": "/v1/rollouts/search?reward_min=0.5&reward_max=1&limit=50",
        "search: q=whiteboard": "/v1/rollouts/search?q=WhiteBoard&limit=50&descending=true",
        "search: q=no-match (full scan)": "/v1/rollouts/search?q=zzzz&limit=50",
        "search: sort final_reward desc": "/v1/rollouts/search?sort_by=final_reward&descending=true&limit=50",
        "search: sort final_reward asc": "/v1/rollouts/search?sort_by=final_reward&limit=50",
        "search: offset 50000": f"/v1/rollouts/search?limit=50&offset={n_rollouts // 2}",
        "search: all filters": "/v1/rollouts/search?status=succeeded&mode=train&resources_id=rs-3"
        "&reward_min=0.5&q=room",
        "transitions (group of ~20)": f"/v1/rollouts/{sample_id}/transitions",
        "metrics/names": "/v1/metrics/names",
        "errors/summary (500 failed)": "/v1/errors/summary?bucket_s=3600",
        "resources/scores (all rollouts)": "/v1/resources/scores",
    }
    if only is not None:
        queries = {label: query for label, query in queries.items() if only in label}
    out: list[tuple[str, float, float]] = []
    try:
        async with (
            serve_in_background(create_app(store)) as url,
            httpx.AsyncClient(base_url=url, timeout=120) as client,
        ):
            for label, query in queries.items():
                n = repeats if "scores" not in label and "errors" not in label else 3
                times = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    answer = await client.get(query)
                    times.append((time.perf_counter() - t0) * 1000)
                    answer.raise_for_status()
                times.sort()
                out.append((label, statistics.median(times), times[min(len(times) - 1, int(0.95 * len(times)))]))
    finally:
        await store.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--only", default=None, help="time only the queries whose label contains this, e.g. scores")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "store.db"
        t0 = time.perf_counter()
        n_spans = fill(path, args.rollouts)
        print(
            f"filled {args.rollouts} rollouts, {n_spans} spans in {time.perf_counter() - t0:.1f} s"
            f" ({path.stat().st_size / 1e6:.0f} MB)"
        )
        rows = asyncio.run(measure(path, args.rollouts, args.repeats, args.only))
    print(f"{'query':40s} {'median ms':>10s} {'p95 ms':>8s}")
    for label, median, p95 in rows:
        print(f"{label:40s} {median:10.1f} {p95:8.1f}")


if __name__ == "__main__":
    main()
