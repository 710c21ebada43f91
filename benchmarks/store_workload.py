#!/usr/bin/env python3
"""Store workloads W1 / W1p / W2, measured on agentbolt and on agent-lightning 0.3.0 side by side.

W1 ("rollout lifecycle") follows the implementation-neutral definition the team wrote for it (kept in the
repository's shared bench folder as ``workload.md``): P=2 producers enqueue N tasks one call each while C consumers
claim, start, add K spans one call each, add the reward and finish; then one reader reads every rollout's spans
back, and an untimed check verifies that nothing was lost, duplicated, corrupted or reordered.
W1p pre-fills the queue before the clock starts. W2 is W1 with the batch forms: producers enqueue 50 tasks per
call and a consumer sends the K spans and the reward of a rollout in one call.

This harness uses only the standard library at import time; a store is plugged in through an adapter class
(``ADAPTERS`` in ``store_adapters.py`` beside this file). The agentbolt adapters import agentbolt; the
agent-lightning adapters import ``agentlightning``, so they run under a Python that has it installed (``--agl-python``,
e.g. a venv with ``agentlightning==0.3.0``).

Usage::

    python benchmarks/store_workload.py run --adapter ab-memory --size medium -C 8
    python benchmarks/store_workload.py run --adapter ab-http --size medium -C 32 --workload W2
    python benchmarks/store_workload.py matrix --adapters ab-memory,ab-sqlite,ab-http,agl-inproc,agl-http \\
        --sizes small,medium -C 1,8,32 --agl-python /tmp/aglbench/venv/bin/python --out results.jsonl
    python benchmarks/store_workload.py ceiling            # raw uvicorn requests/s and raw SQLite inserts/s
    python benchmarks/store_workload.py table results.jsonl

Each run prints one JSON line (and appends it to ``--out``): rollouts/s, spans/s, p50/p90/p99/max per operation,
peak RSS and CPU seconds of the store process, and the correctness check (``ok``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SIZES: dict[str, tuple[int, int]] = {"tiny": (20, 3), "small": (200, 5), "medium": (2000, 10), "large": (10000, 20)}
"""size -> (N tasks, K spans per rollout)."""
PRODUCERS = 2
EMPTY_POLL_SLEEP_S = 0.005
READ_GRACE_S = 30.0
KILL_MARGIN_S = 180.0
POOL_SIZE = 64
POOL_SEED = 1234
W2_ENQUEUE_BATCH = 50
SPAN_NAME = "openai.chat.completion"
OPS = (
    "enqueue",
    "enqueue_batch",
    "dequeue",
    "dequeue_empty",
    "start_attempt",
    "add_span",
    "add_spans_batch",
    "add_reward",
    "finish",
    "query_spans",
)
LOG_DIR = Path(tempfile.gettempdir()) / "agentbolt-bench-logs"
HERE = Path(__file__).resolve().parent
REPO = HERE.parent

sys.path.insert(0, str(HERE))
from store_adapters import ADAPTERS, Adapter, SpanSpec  # noqa: E402  (beside this file; stdlib-only import)


# ----------------------------------------------------------------------------------------------- payloads
def _pool() -> list[str]:
    """64 pre-generated span payloads (compact JSON), seeded, so that generation costs almost nothing."""
    rng = random.Random(POOL_SEED)
    words = ["agent", "tool", "call", "answer", "table", "value", "select", "where", "group", "order", "limit"]

    def text(n: int) -> str:
        out = ""
        while len(out) < n:
            out += rng.choice(words) + " "
        return out[:n]

    pool = []
    for _ in range(POOL_SIZE):
        entry = {
            "gen_ai.system": "openai",
            "gen_ai.request.model": "bench-model",
            "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": text(120),
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": text(120),
            "prompt_token_ids": [rng.randrange(32000) for _ in range(100)],
            "response_token_ids": [rng.randrange(32000) for _ in range(100)],
            "gen_ai.usage.prompt_tokens": 100,
            "gen_ai.usage.completion_tokens": 100,
        }
        pool.append(json.dumps(entry, separators=(",", ":")))
    return pool


POOL = _pool()


def span_attributes(i: int, j: int, k: int) -> dict[str, Any]:
    """Attributes of span ``j`` of task ``i``: fresh objects every call (parsed from the pool entry's JSON)."""
    attrs = json.loads(POOL[(i * k + j) % POOL_SIZE])
    attrs["bench.task_index"] = i
    attrs["bench.span_index"] = j
    return attrs


def make_span(i: int, j: int, k: int) -> SpanSpec:
    now = time.time()
    return SpanSpec(SPAN_NAME, f"{i + 1:032x}", f"{i * k + j + 1:016x}", None, now, now, span_attributes(i, j, k))


def reward_for(i: int) -> float:
    return (i % 100) / 100


def task_input(i: int) -> dict[str, Any]:
    return {"task_index": i, "question": f"task {i}: " + ("what is the total of the listed values? " * 3)[:90]}


# ----------------------------------------------------------------------------------------------- measuring
class Recorder:
    """Latencies (ms) per operation, and exceptions per operation and type."""

    def __init__(self) -> None:
        self.lat: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.error_samples: list[str] = []

    async def timed(self, op: str, coro: Any) -> Any:
        t0 = time.perf_counter()
        try:
            result = await coro
        except Exception as exc:
            self.errors[f"{op}:{type(exc).__name__}"] += 1
            if len(self.error_samples) < 20:
                self.error_samples.append(f"{op}: {type(exc).__name__}: {str(exc)[:200]}")
            raise
        self.lat[op].append((time.perf_counter() - t0) * 1000.0)
        return result

    def merge(self, other: dict[str, Any]) -> None:
        for op, xs in other["lat"].items():
            self.lat[op].extend(xs)
        for key, n in other["errors"].items():
            self.errors[key] += n
        self.error_samples.extend(other["error_samples"][: max(0, 20 - len(self.error_samples))])

    def dump(self) -> dict[str, Any]:
        return {"lat": dict(self.lat), "errors": dict(self.errors), "error_samples": self.error_samples}


def percentiles(xs: list[float]) -> dict[str, float | int]:
    if not xs:
        return {"count": 0}
    s = sorted(xs)

    def pct(p: float) -> float:
        return round(s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))], 3)

    return {
        "count": len(s),
        "p50": pct(50),
        "p90": pct(90),
        "p99": pct(99),
        "max": round(s[-1], 3),
        "mean": round(sum(s) / len(s), 3),
    }


def proc_status_kb(pid: int, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def proc_cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return None


def mb(kb: int | None) -> float | None:
    return None if kb is None else round(kb / 1024, 1)


@dataclass
class Shared:
    """What the producers, consumers and the reader of one process share."""

    n: int
    k: int
    workload: str
    deadline: float
    producers_done: threading.Event | Any
    rec: Recorder = field(default_factory=Recorder)
    claimed: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    empty_polls: int = 0
    rejected_spans: int = 0
    last_finish: float = 0.0


async def consumer(ad: Adapter, sh: Shared, worker_id: str) -> None:
    rec, k = sh.rec, sh.k
    while time.monotonic() < sh.deadline:
        t0 = time.perf_counter()
        try:
            claim = await ad.dequeue(worker_id)
        except Exception as exc:
            rec.errors[f"dequeue:{type(exc).__name__}"] += 1
            if len(rec.error_samples) < 20:
                rec.error_samples.append(f"dequeue: {type(exc).__name__}: {str(exc)[:200]}")
            await asyncio.sleep(EMPTY_POLL_SLEEP_S)
            continue
        dt = (time.perf_counter() - t0) * 1000.0
        if claim is None:
            rec.lat["dequeue_empty"].append(dt)
            sh.empty_polls += 1
            if sh.producers_done.is_set():
                return
            await asyncio.sleep(EMPTY_POLL_SLEEP_S)
            continue
        rec.lat["dequeue"].append(dt)
        sh.claimed.append(claim.rollout_id)
        i = claim.input["task_index"]
        try:
            await rec.timed("start_attempt", ad.start_attempt(claim, worker_id))
            if sh.workload == "W2":
                spans = [make_span(i, j, k) for j in range(k)]
                await rec.timed("add_spans_batch", ad.add_spans_and_reward(claim, spans, reward_for(i)))
            else:
                for j in range(k):
                    if not await rec.timed("add_span", ad.add_span(claim, j + 1, make_span(i, j, k))):
                        sh.rejected_spans += 1
                await rec.timed("add_reward", ad.add_reward(claim, k + 1, reward_for(i)))
            await rec.timed("finish", ad.finish(claim))
            sh.finished.append(claim.rollout_id)
            sh.last_finish = time.monotonic()
        except Exception:
            continue  # counted by the recorder; the rollout is reported by the verification


async def producer(ad: Adapter, sh: Shared, p: int, ids: dict[int, str]) -> None:
    mine = [i for i in range(sh.n) if i % PRODUCERS == p]
    if sh.workload == "W2":
        for at in range(0, len(mine), W2_ENQUEUE_BATCH):
            chunk = mine[at : at + W2_ENQUEUE_BATCH]
            try:
                got = await sh.rec.timed("enqueue_batch", ad.enqueue_many([task_input(i) for i in chunk]))
            except Exception:
                continue
            ids.update(zip(chunk, got, strict=True))
        return
    for i in mine:
        try:
            ids[i] = await sh.rec.timed("enqueue", ad.enqueue(task_input(i)))
        except Exception:
            continue


@dataclass
class ReadResult:
    """What the reader saw. Each rollout's spans are checked as soon as they are read and then dropped, so the
    load generator's memory does not grow with the spans it reads back (peak RSS stays the store's)."""

    checks: dict[str, dict[str, int]] = field(default_factory=dict)
    spans_read: int = 0
    check_s: float = 0.0
    span_ids_seen: set[str] = field(default_factory=set)


def check_rollout_spans(i: int, k: int, got: list[dict[str, Any]], span_ids_seen: set[str]) -> dict[str, int]:
    """Counts of what is wrong with the spans read back for task ``i`` (all zero when they are exactly as sent)."""
    c = {"out_of_order": 0, "missing": 0, "duplicate": 0, "corrupt": 0, "rewards_missing": 0, "rewards_wrong": 0}
    regular = [s for s in got if s["reward"] is None]
    rewards = [s for s in got if s["reward"] is not None]
    seqs = [s["seq"] for s in got]
    if seqs != sorted(seqs) or len(set(seqs)) != len(seqs):
        c["out_of_order"] += 1
    indices = [s["attributes"].get("bench.span_index") for s in regular]
    if indices != sorted(indices):
        c["out_of_order"] += 1
    c["missing"] += max(0, k - len({x for x in indices if isinstance(x, int)}))
    for s in regular:
        if s["span_id"] in span_ids_seen:
            c["duplicate"] += 1
        span_ids_seen.add(s["span_id"])
        j = s["attributes"].get("bench.span_index")
        if not isinstance(j, int) or s["attributes"] != span_attributes(i, j, k) or s["name"] != SPAN_NAME:
            c["corrupt"] += 1
    if len(regular) > k:
        c["duplicate"] += len(regular) - k
    if not rewards:
        c["rewards_missing"] += 1
    elif len(rewards) > 1 or abs(float(rewards[0]["reward"]) - reward_for(i)) > 1e-12:
        c["rewards_wrong"] += 1
    return c


async def read_all(ad: Adapter, rec: Recorder, ids: dict[int, str], k: int, deadline: float) -> ReadResult:
    """The single sequential reader: ``query_spans`` of every enqueued rollout in enqueue order."""
    out = ReadResult()
    for i in sorted(ids):
        rid = ids[i]
        if time.monotonic() > deadline:
            break
        try:
            got = await rec.timed("query_spans", ad.query_spans(rid))
        except Exception:
            continue
        t0 = time.perf_counter()
        out.spans_read += len(got)
        out.checks[rid] = check_rollout_spans(i, k, got, out.span_ids_seen)
        out.check_s += time.perf_counter() - t0
    return out


def verify(
    n: int,
    ids: dict[int, str],
    claimed: list[str],
    finished: list[str],
    read: ReadResult,
    states: dict[str, tuple[str, int]],
    partial: bool,
) -> dict[str, Any]:
    """The correctness checks of the workload; ``ok`` is true when nothing was lost, duplicated or corrupted."""
    claim_counts: dict[str, int] = defaultdict(int)
    for rid in claimed:
        claim_counts[rid] += 1
    c: dict[str, Any] = {
        "enqueued": len(ids),
        "enqueue_missing": n - len(ids),
        "distinct_ids": len(set(ids.values())) == len(ids),
        "duplicate_claims": sum(1 for v in claim_counts.values() if v > 1),
        "unclaimed": len(set(ids.values()) - set(claim_counts)),
        "not_succeeded": defaultdict(int),
        "multi_attempt": 0,
        "claimed_without_attempt": 0,
        "unclaimed_status": defaultdict(int),
        "spans_missing": 0,
        "spans_duplicate": 0,
        "spans_corrupt": 0,
        "spans_out_of_order": 0,
        "rewards_missing": 0,
        "rewards_wrong": 0,
        "rollouts_read": 0,
        "rollouts_unread": 0,
    }
    finished_set = set(finished)
    for rid in ids.values():
        status, attempts = states.get(rid, ("missing", 0))
        if rid not in claim_counts:
            c["unclaimed_status"][status] += 1
            continue
        if status != "succeeded":
            c["not_succeeded"][status] += 1
        if attempts > 1:
            c["multi_attempt"] += 1
        if attempts == 0:
            c["claimed_without_attempt"] += 1
        check = read.checks.get(rid)
        if check is None:
            if rid in finished_set:
                c["rollouts_unread"] += 1
            continue
        c["rollouts_read"] += 1
        for key in ("missing", "duplicate", "corrupt", "out_of_order"):
            c[f"spans_{key}"] += check[key]
        c["rewards_missing"] += check["rewards_missing"]
        c["rewards_wrong"] += check["rewards_wrong"]
    c["not_succeeded"] = dict(c["not_succeeded"])
    c["unclaimed_status"] = dict(c["unclaimed_status"])
    bad = (
        not c["distinct_ids"]
        or c["duplicate_claims"]
        or c["multi_attempt"]
        or c["claimed_without_attempt"]
        or sum(c["not_succeeded"].values())
        or c["spans_missing"]
        or c["spans_duplicate"]
        or c["spans_corrupt"]
        or c["spans_out_of_order"]
        or c["rewards_missing"]
        or c["rewards_wrong"]
        or c["rollouts_unread"]
    )
    if not partial:
        bad = bad or c["unclaimed"] or c["enqueue_missing"]
    c["ok_scope"] = "completed rollouts only (run cut by the deadline)" if partial else "every rollout"
    c["ok"] = not bad
    return c


# ----------------------------------------------------------------------------------------------- running
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ok(url: str, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return True
        except Exception:
            time.sleep(0.1)
    return False


async def _load_phase(
    ad_for_producers: Adapter,
    consumers: list[tuple[Adapter, str]],
    sh: Shared,
    ids: dict[int, str],
    prefill: bool,
    budget_s: float,
) -> dict[str, float]:
    """Producers (and, in-process, consumers) from the start signal on, until ``budget_s`` has passed; returns phase
    timings."""
    timing: dict[str, float] = {}
    if prefill:
        t0 = time.monotonic()
        await asyncio.gather(*(producer(ad_for_producers, sh, p, ids) for p in range(PRODUCERS)))
        timing["t_enqueue_s"] = time.monotonic() - t0
        sh.producers_done.set()
    start = time.monotonic()
    sh.deadline = start + budget_s

    async def producers() -> None:
        if not prefill:
            t0 = time.monotonic()
            await asyncio.gather(*(producer(ad_for_producers, sh, p, ids) for p in range(PRODUCERS)))
            timing["t_enqueue_s"] = time.monotonic() - t0
            sh.producers_done.set()

    await asyncio.gather(producers(), *(consumer(ad, sh, wid) for ad, wid in consumers))
    timing["start"] = start
    return timing


def _result_base(args: argparse.Namespace, cls: type[Adapter], n: int, k: int, version: str) -> dict[str, Any]:
    return {
        "workload": args.workload + ("p" if args.prefill and args.workload == "W1" else ""),
        "adapter": cls.name,
        "impl": cls.impl,
        "impl_version": version,
        "mode": cls.mode,
        "size": args.size,
        "N": n,
        "K": k,
        "C": args.consumers,
        "P": PRODUCERS,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def _finish_result(
    res: dict[str, Any],
    rec: Recorder,
    sh: Shared,
    ids: dict[int, str],
    read: ReadResult,
    states: dict[str, tuple[str, int]],
    t_load: float,
    t_read: float,
    timing: dict[str, float],
    partial: bool,
) -> dict[str, Any]:
    done = len(set(sh.finished))
    n_spans_read = read.spans_read
    t_read = max(1e-9, t_read - read.check_s)  # the reader's own checking is not the store's time
    res.update(
        {
            "rollouts_per_s": round(done / t_load, 2) if t_load > 0 else None,
            "spans_per_s": round(done * sh.k / t_load, 1) if t_load > 0 else None,
            "enqueue_per_s": round(len(ids) / timing["t_enqueue_s"], 1) if timing.get("t_enqueue_s") else None,
            "read_spans_per_s": round(n_spans_read / t_read, 1) if t_read > 0 else None,
            "read_rollouts_per_s": round(len(read.checks) / t_read, 1) if t_read > 0 else None,
            "t_load_s": round(t_load, 3),
            "t_read_s": round(t_read, 3),
            "t_enqueue_s": round(timing.get("t_enqueue_s", 0.0), 3),
            "rollouts_done": done,
            "empty_polls": sh.empty_polls,
            "add_span_rejected": sh.rejected_spans,
            "span_attr_bytes": round(
                sum(len(json.dumps(span_attributes(i, 0, sh.k), separators=(",", ":"))) for i in range(64)) / 64, 1
            ),
            "latency_ms": {op: percentiles(rec.lat.get(op, [])) for op in OPS if rec.lat.get(op)},
            "errors": dict(rec.errors),
            "error_samples": rec.error_samples,
            "partial": partial,
        }
    )
    res.update(verify(sh.n, ids, sh.claimed, sh.finished, read, states, partial))
    if rec.errors:
        res["ok"] = False
    return res


async def run_inproc(cls: type[Adapter], args: argparse.Namespace, n: int, k: int) -> dict[str, Any]:
    rss_import = proc_status_kb(os.getpid(), "VmRSS")
    ad = cls()
    await ad.open()
    res = _result_base(args, cls, n, k, ad.impl_version())
    rss_base = proc_status_kb(os.getpid(), "VmRSS")
    sh = Shared(n, k, args.workload, math.inf, asyncio.Event())  # the deadline is set at the start signal
    ids: dict[int, str] = {}
    cpu0 = proc_cpu_s(os.getpid()) or 0.0
    consumers = [(ad, f"worker-{c}") for c in range(args.consumers)]
    timing = await _load_phase(ad, consumers, sh, ids, args.prefill, args.budget)
    start = timing["start"]
    t_load = (sh.last_finish or time.monotonic()) - start
    rss_load = proc_status_kb(os.getpid(), "VmRSS")
    partial = time.monotonic() >= sh.deadline
    read_deadline = max(sh.deadline, time.monotonic() + READ_GRACE_S) if partial else math.inf
    t0 = time.monotonic()
    ordered = [ids[i] for i in sorted(ids)]
    read = await read_all(ad, sh.rec, ids, k, read_deadline)
    t_read = time.monotonic() - t0
    cpu_s = (proc_cpu_s(os.getpid()) or 0.0) - cpu0
    states = await ad.rollout_states(ordered)
    await ad.close()
    res.update(
        {
            "W": 1,
            "rss_mb": {
                "peak": mb(proc_status_kb(os.getpid(), "VmHWM")),
                "after_imports": mb(rss_import),
                "base": mb(rss_base),
                "end_of_load": mb(rss_load),
            },
            "store_cpu_s": round(cpu_s, 2),
        }
    )
    return _finish_result(res, sh.rec, sh, ids, read, states, t_load, t_read, timing, partial)


def _worker_main(
    adapter_name: str,
    endpoint: str,
    worker_ids: list[str],
    n: int,
    k: int,
    workload: str,
    budget_s: float,
    ready: Any,
    go: Any,
    producers_done: Any,
    results: Any,
) -> None:
    """One client process: its consumers share one adapter (one client object) and one event loop."""

    async def main() -> dict[str, Any]:
        ad = ADAPTERS[adapter_name](endpoint)
        await ad.open()
        ready.put(os.getpid())
        while not go.wait(0.05):
            pass
        sh = Shared(n, k, workload, time.monotonic() + budget_s, producers_done)
        await asyncio.gather(*(consumer(ad, sh, wid) for wid in worker_ids))
        await ad.close()
        return {
            "rec": sh.rec.dump(),
            "claimed": sh.claimed,
            "finished": sh.finished,
            "empty_polls": sh.empty_polls,
            "rejected": sh.rejected_spans,
            "last_finish_wall": time.time() - (time.monotonic() - sh.last_finish) if sh.last_finish else 0.0,
        }

    try:
        results.put(asyncio.run(main()))
    except Exception:
        results.put({"fatal": traceback.format_exc()})


def run_server(cls: type[Adapter], args: argparse.Namespace, n: int, k: int) -> dict[str, Any]:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="bench-server-")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log_path = LOG_DIR / f"{cls.name}-{args.workload}-{args.size}-C{args.consumers}-{int(time.time())}.log"
    with open(log_path, "wb") as log_file:
        server = cls.launch_server("127.0.0.1", port, workdir, log_file)
    try:
        if not wait_ok(cls.health_url(endpoint), 120):
            raise SystemExit(f"server did not come up; see {log_path}")
        rss_base = proc_status_kb(server.pid, "VmRSS")
        w = min(args.consumers, args.procs)
        ctx = mp.get_context("spawn")
        ready, results = ctx.Queue(), ctx.Queue()
        go, producers_done = ctx.Event(), ctx.Event()
        procs = []
        for p in range(w):
            wids = [f"worker-{c}" for c in range(args.consumers) if c % w == p]
            procs.append(
                ctx.Process(
                    target=_worker_main,
                    args=(
                        cls.name,
                        endpoint,
                        wids,
                        n,
                        k,
                        args.workload,
                        args.budget,
                        ready,
                        go,
                        producers_done,
                        results,
                    ),
                )
            )
        for proc in procs:
            proc.start()
        for _ in procs:
            ready.get(timeout=300)

        async def driver() -> dict[str, Any]:
            ad = cls(endpoint)
            await ad.open()
            res = _result_base(args, cls, n, k, ad.impl_version())
            sh = Shared(n, k, args.workload, math.inf, producers_done)  # producers only; the workers hold deadlines
            ids: dict[int, str] = {}
            cpu0 = proc_cpu_s(server.pid) or 0.0
            if args.prefill:
                t0 = time.monotonic()
                await asyncio.gather(*(producer(ad, sh, p, ids) for p in range(PRODUCERS)))
                t_enqueue = time.monotonic() - t0
                producers_done.set()
                cpu0 = proc_cpu_s(server.pid) or 0.0
            start_wall, start = time.time(), time.monotonic()
            go.set()
            if not args.prefill:
                await asyncio.gather(*(producer(ad, sh, p, ids) for p in range(PRODUCERS)))
                t_enqueue = time.monotonic() - start
                producers_done.set()
            parts = [await asyncio.to_thread(results.get, True, args.budget + KILL_MARGIN_S) for _ in procs]
            end_load = time.monotonic()
            cpu_s = (proc_cpu_s(server.pid) or 0.0) - cpu0
            rss_load = proc_status_kb(server.pid, "VmRSS")
            last_finish_wall = 0.0
            for part in parts:
                if "fatal" in part:
                    raise SystemExit("worker process failed:\n" + part["fatal"])
                sh.rec.merge(part["rec"])
                sh.claimed.extend(part["claimed"])
                sh.finished.extend(part["finished"])
                sh.empty_polls += part["empty_polls"]
                sh.rejected_spans += part["rejected"]
                last_finish_wall = max(last_finish_wall, part["last_finish_wall"])
            t_load = (last_finish_wall - start_wall) if last_finish_wall else end_load - start
            partial = time.monotonic() >= start + args.budget
            read_deadline = time.monotonic() + READ_GRACE_S if partial else math.inf
            ordered = [ids[i] for i in sorted(ids)]
            t0 = time.monotonic()
            read = await read_all(ad, sh.rec, ids, k, read_deadline)
            t_read = time.monotonic() - t0
            states = await ad.rollout_states(ordered)
            await ad.close()
            res.update(
                {
                    "W": w,
                    "rss_mb": {
                        "peak": mb(proc_status_kb(server.pid, "VmHWM")),
                        "base": mb(rss_base),
                        "end_of_load": mb(rss_load),
                        "end": mb(proc_status_kb(server.pid, "VmRSS")),
                    },
                    "store_cpu_s": round(cpu_s, 2),
                }
            )
            return _finish_result(
                res, sh.rec, sh, ids, read, states, t_load, t_read, {"t_enqueue_s": t_enqueue}, partial
            )

        result = asyncio.run(driver())
        for proc in procs:
            proc.join(timeout=30)
        result["server_log"] = str(log_path)
        return result
    finally:
        server.kill()
        server.wait()


def cmd_run(args: argparse.Namespace) -> dict[str, Any]:
    cls = ADAPTERS[args.adapter]
    n, k = SIZES[args.size]
    if args.workload == "W2" and args.prefill:
        raise SystemExit("--prefill applies to W1 only")
    result = asyncio.run(run_inproc(cls, args, n, k)) if cls.mode == "inproc" else run_server(cls, args, n, k)
    line = json.dumps(result, separators=(",", ":"))
    print(line, flush=True)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(line + "\n")
    return result


def cmd_matrix(args: argparse.Namespace) -> None:
    """Every configuration in a fresh process, killed past the deadline plus a margin; agl ones under --agl-python."""
    for workload in args.workloads.split(","):
        for size in args.sizes.split(","):
            for name in args.adapters.split(","):
                for c in [int(x) for x in args.consumers_list.split(",")]:
                    python = args.agl_python if ADAPTERS[name].impl == "agentlightning" else sys.executable
                    if python is None:
                        print(f"# skipping {name}: no --agl-python given", file=sys.stderr)
                        continue
                    cmd = [python, __file__, "run", "--adapter", name, "--size", size, "-C", str(c)]
                    cmd += [
                        "--workload",
                        workload.rstrip("p"),
                        "--budget",
                        str(args.budget),
                        "--procs",
                        str(args.procs),
                    ]
                    if workload == "W1p":
                        cmd.append("--prefill")
                    if args.out:
                        cmd += ["--out", args.out]
                    print(f"# {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
                    try:
                        subprocess.run(cmd, timeout=args.budget + KILL_MARGIN_S + 60, check=False)
                    except subprocess.TimeoutExpired:
                        line = json.dumps(
                            {"workload": workload, "adapter": name, "size": size, "C": c, "status": "killed"}
                        )
                        print(line, flush=True)
                        if args.out:
                            with open(args.out, "a") as fh:
                                fh.write(line + "\n")


# ----------------------------------------------------------------------------------------------- ceiling
def _trivial_asgi_server(port: int) -> subprocess.Popen[bytes]:
    code = (
        "import uvicorn\n"
        "async def app(scope, receive, send):\n"
        "    if scope['type'] != 'http':\n        return\n"
        "    headers = [(b'content-type', b'text/plain')]\n"
        "    await send({'type': 'http.response.start', 'status': 200, 'headers': headers})\n"
        "    await send({'type': 'http.response.body', 'body': b'ok'})\n"
        f"uvicorn.run(app, host='127.0.0.1', port={port}, log_level='warning', access_log=False)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def _hammer(url: str, concurrency: int, seconds: float, out: Any) -> None:
    """``concurrency`` loops of GET ``url`` on one aiohttp session (the client library of HttpLightningStore)."""
    import aiohttp

    async def main() -> int:
        done = 0
        end = time.monotonic() + seconds
        async with aiohttp.ClientSession() as session:

            async def loop() -> None:
                nonlocal done
                while time.monotonic() < end:
                    async with session.get(url) as resp:
                        await resp.read()
                        resp.raise_for_status()
                    done += 1

            await asyncio.gather(*(loop() for _ in range(concurrency)))
        return done

    out.put(asyncio.run(main()))


def cmd_ceiling(args: argparse.Namespace) -> None:
    """Raw uvicorn requests/s on a trivial route (aiohttp clients in W processes, as in server mode) and raw SQLite
    single-row autocommit inserts/s of a span-sized row (WAL, synchronous FULL and NORMAL)."""
    import sqlite3

    port = free_port()
    server = _trivial_asgi_server(port)
    try:
        if not wait_ok(f"http://127.0.0.1:{port}/", 60):
            raise SystemExit("trivial uvicorn server did not start")
        for c in (1, 8, 32):
            w = min(c, args.procs)
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            per = [c // w + (1 if i < c % w else 0) for i in range(w)]
            procs = [ctx.Process(target=_hammer, args=(f"http://127.0.0.1:{port}/", n, 5.0, q)) for n in per]
            for p in procs:
                p.start()
            total = sum(q.get(timeout=120) for _ in procs)
            for p in procs:
                p.join()
            print(
                json.dumps({"ceiling": "uvicorn_trivial_route", "C": c, "W": w, "requests_per_s": round(total / 5.0)})
            )
    finally:
        server.kill()
        server.wait()
    payload = POOL[0]
    with tempfile.TemporaryDirectory() as d:
        for sync in ("FULL", "NORMAL"):
            conn = sqlite3.connect(Path(d) / f"raw-{sync}.db", isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={sync}")
            conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, rollout TEXT, seq INTEGER, body TEXT)")
            n = 3000
            t0 = time.perf_counter()
            for i in range(n):
                conn.execute("INSERT INTO t (rollout, seq, body) VALUES (?, ?, ?)", (f"ro-{i // 10}", i % 10, payload))
            dt = time.perf_counter() - t0
            print(
                json.dumps({"ceiling": "sqlite_insert_autocommit", "synchronous": sync, "inserts_per_s": round(n / dt)})
            )
            conn.close()


# ----------------------------------------------------------------------------------------------- table
def cmd_table(args: argparse.Namespace) -> None:
    rows = []
    for path in args.files:
        for line in Path(path).read_text().splitlines():
            if line.strip() and line.lstrip().startswith("{"):
                rows.append(json.loads(line))
    head = (
        "| workload | adapter | size | C | W | rollouts/s | spans/s | add_span p50/p99 ms | dequeue p50/p99 | max ms "
        "| peak RSS MB | store CPU s | ok |"
    )
    print(head)
    print("|" + "|".join(["---"] * (head.count("|") - 1)) + "|")
    for r in rows:
        if r.get("status") == "killed":
            print(f"| {r['workload']} | {r['adapter']} | {r['size']} | {r['C']} | | killed | | | | | | | |")
            continue
        lat = r.get("latency_ms", {})
        span_op = "add_spans_batch" if r["workload"] == "W2" else "add_span"
        sp, dq = lat.get(span_op, {}), lat.get("dequeue", {})
        mx = max((v.get("max", 0) for v in lat.values()), default=0)
        print(
            f"| {r['workload']} | {r['adapter']} | {r['size']} | {r['C']} | {r.get('W', '')} | {r['rollouts_per_s']} | "
            f"{r['spans_per_s']} | {sp.get('p50')} / {sp.get('p99')} | {dq.get('p50')} / {dq.get('p99')} | "
            f"{round(mx)} | {r['rss_mb']['peak']} | {r['store_cpu_s']} | {'yes' if r['ok'] else 'NO'}"
            f"{' (partial)' if r.get('partial') else ''} |"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="one configuration, one JSON line")
    run.add_argument("--adapter", choices=sorted(ADAPTERS), required=True)
    run.add_argument("--size", choices=sorted(SIZES), default="small")
    run.add_argument("-C", "--consumers", type=int, default=8)
    run.add_argument("--workload", choices=("W1", "W2"), default="W1")
    run.add_argument("--prefill", action="store_true", help="W1p: enqueue everything before the clock starts")
    run.add_argument("--procs", type=int, default=4, help="max worker processes in server mode (W = min(C, procs))")
    run.add_argument("--budget", type=float, default=300.0, help="seconds for the load and read phases")
    run.add_argument("--out", help="append the JSON line to this file")
    mat = sub.add_parser("matrix", help="many configurations, each in a fresh process")
    mat.add_argument("--adapters", default="ab-memory,ab-sqlite,ab-http,agl-inproc,agl-http")
    mat.add_argument("--sizes", default="small,medium")
    mat.add_argument("-C", dest="consumers_list", default="1,8,32")
    mat.add_argument("--workloads", default="W1", help="comma list of W1, W1p, W2")
    mat.add_argument("--agl-python", help="a Python with agentlightning==0.3.0 installed (agl-* adapters)")
    mat.add_argument("--procs", type=int, default=4)
    mat.add_argument("--budget", type=float, default=300.0)
    mat.add_argument("--out")
    ceil = sub.add_parser("ceiling", help="raw uvicorn requests/s and raw SQLite inserts/s on this machine")
    ceil.add_argument("--procs", type=int, default=4)
    tab = sub.add_parser("table", help="markdown table of result files")
    tab.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    {"run": cmd_run, "matrix": cmd_matrix, "ceiling": cmd_ceiling, "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    main()
