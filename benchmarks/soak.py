#!/usr/bin/env python3
"""Soak: rollouts for ``--minutes`` while runners and the server are SIGKILLed at random and restarted.

Processes (all real): one ``agentbolt serve --store sqlite:///DIR/soak.db`` and ``--runners`` ``agentbolt run``
processes (``--concurrency`` slots each, the agents of ``benchmarks/soak_agents.py`` in a child process per attempt).
This script is the driver, a client over HTTP (:class:`~agentbolt.client.HttpLightningStore`):

- it enqueues rollouts at ``--rate`` per second (paused while more than ``--max-backlog`` are not terminal). Each task
  says what its agent does: return a reward, emit spans and rewards, raise, return None, return a string, crash its
  process, hang forever (only with a ``timeout_seconds``), fail at random. Configs: ``short`` (timeout 4 s, lease
  10 s, 3 attempts, ``failed`` retried too), ``short2`` (timeout 6 s, lease 10 s, 2 attempts), ``default`` (no
  config: the API's default lease of 30 s, 1 attempt) and ``default2`` (the default lease, 2 attempts);
- it writes a few spans of its own into running attempts (``add_spans``);
- it records every acknowledged write: each enqueue that returned (its rollout id) and each span batch that
  returned. A call cut by a kill was not acknowledged; the driver retries the enqueue until one is;
- at random (mean ``--kill-every`` seconds apart) it SIGKILLs a runner (restarted after 0-3 s, same worker id) or,
  with probability ``--server-share``, the server (restarted at once on the same SQLite file and port);
- runners that exit on their own are counted (with the end of their log) and restarted.

After ``--minutes``: no more kills; it waits (at most ``--drain-s``) until every rollout of the store is terminal,
SIGKILLs the server one last time and restarts it, then checks and reports: acknowledged rollouts and spans missing
(target 0), rollouts left non-terminal (target 0), store invariants, counts by final status, by attempt status and
cause (``error["cause"]``), by task kind, the longest wait of a rollout for its retry (end of the failed or lost
attempt -> claim of the next; and last sign of life of the lost attempt -> claim of the next), kills done, server
downtime, rollouts/s. Figures are printed and written as JSON (``--out``). No assertion on any figure.

Usage::

    python benchmarks/soak.py --minutes 2 --out /tmp/soak-2.json
    nohup python benchmarks/soak.py --minutes 30 --seed 1 --out /tmp/soak-30.json > /tmp/soak-30.log 2>&1 &
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from agentbolt.client import HttpLightningStore
from agentbolt.errors import AgentboltError, BackendError
from agentbolt.types import Attempt, AttemptStatus, Rollout, RolloutConfig, RolloutStatus, Span

BENCH_DIR = Path(__file__).resolve().parent
AGENT = "soak_agents:agent"

CONFIGS: dict[str, RolloutConfig | None] = {
    "short": RolloutConfig(
        timeout_seconds=4.0,
        unresponsive_seconds=10.0,
        max_attempts=3,
        retry_on=(AttemptStatus.TIMEOUT, AttemptStatus.UNRESPONSIVE, AttemptStatus.FAILED),
    ),
    "short2": RolloutConfig(timeout_seconds=6.0, unresponsive_seconds=10.0, max_attempts=2),
    "default": None,  # the API's default config (default lease, one attempt)
    "default2": RolloutConfig(max_attempts=2),  # the default lease, two attempts
}
CONFIG_WEIGHTS = {"short": 40, "short2": 30, "default": 15, "default2": 15}
KIND_WEIGHTS = {"ok": 40, "spans": 20, "raise": 7, "none": 5, "string": 4, "crash": 4, "hang": 8, "flaky": 12}
NEEDS_TIMEOUT = {"hang"}

NON_TERMINAL = [RolloutStatus.QUEUING, RolloutStatus.PREPARING, RolloutStatus.RUNNING, RolloutStatus.REQUEUING]
TERMINAL = {RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.CANCELLED}
ACTIVE_ATTEMPT = {AttemptStatus.PREPARING, AttemptStatus.RUNNING}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail(path: Path, n: int = 12) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def cause_of(attempt: Attempt) -> str:
    """``error["cause"]``; for an attempt without one, its status (the store's own lease expiry writes no cause)."""
    cause = (attempt.error or {}).get("cause")
    return str(cause) if cause else f"{attempt.status.value} (no error.cause)"


def last_alive(attempt: Attempt, config: RolloutConfig) -> float:
    """When a failed attempt was last known alive: its end; for an expired lease, its end minus the lease (the
    store sets ``last_heartbeat_time`` to the expiry time, so it does not tell)."""
    end = attempt.end_time if attempt.end_time is not None else attempt.start_time
    if attempt.status == AttemptStatus.UNRESPONSIVE and config.unresponsive_seconds is not None:
        return max(attempt.start_time, end - config.unresponsive_seconds)
    return end


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


@dataclass
class Cluster:
    """The server and runner processes, each in its own session (process group) so leftovers can be found."""

    workdir: Path
    port: int
    runners: int
    concurrency: int
    server: subprocess.Popen[bytes] | None = None
    runner_procs: list[subprocess.Popen[bytes] | None] = field(default_factory=list)
    killed_by_us: set[int] = field(default_factory=set)
    pgids: set[int] = field(default_factory=set)
    logs: list[IO[bytes]] = field(default_factory=list)
    server_starts: int = 0
    server_down_since: float | None = None
    server_downtime_s: list[float] = field(default_factory=list)
    server_start_failures: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _log(self, name: str) -> IO[bytes]:
        f = open(self.workdir / name, "ab")  # noqa: SIM115 - closed by close_logs
        self.logs.append(f)
        return f

    def _popen(self, cmd: list[str], log: str) -> subprocess.Popen[bytes]:
        out = self._log(log)
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"},
        )
        self.pgids.add(proc.pid)
        return proc

    async def start_server(self, create: bool = False) -> None:
        store = f"sqlite:///{self.workdir / 'soak.db'}"
        cmd = [sys.executable, "-m", "agentbolt.cli.main", "serve", "--store", store, "--port", str(self.port)]
        if create:
            cmd.append("--create")
        if self.server_down_since is None:
            self.server_down_since = time.monotonic()
        for _ in range(20):
            self.server = self._popen(cmd, "server.log")
            self.server_starts += 1
            if await self._healthy(self.server, 90.0):
                self.server_downtime_s.append(time.monotonic() - self.server_down_since)
                self.server_down_since = None
                return
            self.server_start_failures += 1
            if self.server.poll() is None:
                self.server.kill()
            await asyncio.to_thread(self.server.wait)
            await asyncio.sleep(1.0)
        raise RuntimeError(f"the server did not start; see {self.workdir / 'server.log'}")

    async def _healthy(self, proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(base_url=self.url, timeout=2.0) as client:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    return False
                try:
                    if (await client.get("/v1/health")).status_code == 200:
                        return True
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.2)
        return False

    async def kill_server(self) -> None:
        assert self.server is not None
        self.server_down_since = time.monotonic()
        self.server.send_signal(signal.SIGKILL)
        await asyncio.to_thread(self.server.wait)

    def start_runner(self, i: int) -> None:
        cmd = [sys.executable, "-m", "agentbolt.cli.main", "run", "--agent", AGENT, "--store", self.url]
        cmd += ["--concurrency", str(self.concurrency), "--no-instrument", "--worker-id", f"soak-r{i}"]
        cmd += ["--app-dir", str(BENCH_DIR)]
        proc = self._popen(cmd, f"runner-{i}.log")
        if i < len(self.runner_procs):
            self.runner_procs[i] = proc
        else:
            self.runner_procs.append(proc)

    async def kill_runner(self, i: int) -> None:
        proc = self.runner_procs[i]
        assert proc is not None
        self.killed_by_us.add(proc.pid)
        proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proc.wait)
        self.runner_procs[i] = None

    async def stop(self) -> None:
        """SIGTERM the runners, then the server; SIGKILL what is still alive after 15 s."""
        for procs in ([p for p in self.runner_procs if p is not None], [self.server] if self.server else []):
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 15.0
            for p in procs:
                while p.poll() is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                if p.poll() is None:
                    p.kill()
                    p.wait()

    def leftover_groups(self) -> dict[int, int]:
        """Process groups started by this soak that still hold a process (pgid -> 1), after everything stopped."""
        left: dict[int, int] = {}
        for pgid in sorted(self.pgids):
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                continue
            except PermissionError:
                pass
            left[pgid] = 1
        return left

    def kill_leftovers(self) -> None:
        for pgid in self.leftover_groups():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)

    def close_logs(self) -> None:
        for f in self.logs:
            f.close()


@dataclass
class Acks:
    """Acknowledged writes of the driver, and the counts of what it saw."""

    rollouts: dict[str, dict[str, Any]] = field(default_factory=dict)  # rollout id -> {kind, config, acked_at}
    spans: dict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))  # (rollout, attempt)
    enqueue_retries: int = 0
    span_batches: int = 0
    span_write_failures: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="agentbolt-soak-"))
        workdir.mkdir(parents=True, exist_ok=True)
        self.cluster = Cluster(workdir, free_port(), args.runners, args.concurrency)
        self.store = HttpLightningStore(self.cluster.url, timeout_s=20.0, read_retries=3)
        self.acks = Acks()
        self.kills: Counter[str] = Counter()
        self.kill_log: list[tuple[float, str]] = []  # (epoch seconds, "server" or the runner's worker id)
        self.runner_exits: list[dict[str, Any]] = []  # runner exits we did not cause
        self.stopping = False
        self.backlog = 0
        self.chaos_lock = asyncio.Lock()

    # ------------------------------------------------------------------ load
    def _task(self, n: int) -> tuple[dict[str, Any], str]:
        rng = self.rng
        kind = rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
        config = rng.choices(list(CONFIG_WEIGHTS), weights=list(CONFIG_WEIGHTS.values()))[0]
        if kind in NEEDS_TIMEOUT and (CONFIGS[config] or RolloutConfig()).timeout_seconds is None:
            config = rng.choice(["short", "short2"])  # a hanging agent ends only at a timeout
        task = {
            "n": n,
            "kind": kind,
            "sleep_s": round(rng.uniform(0.1, 1.5), 3),
            "reward": round(rng.random(), 4),
            "steps": rng.randint(1, 4),
            "fail_p": 0.5,
        }
        return task, config

    async def producer(self, load_end: float) -> None:
        n = 0
        interval = 1.0 / self.args.rate
        next_at = time.monotonic()
        while time.monotonic() < load_end:
            if self.backlog > self.args.max_backlog:
                await asyncio.sleep(0.5)
                next_at = time.monotonic()
                continue
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            task, config_name = self._task(n)
            n += 1
            while True:
                try:
                    rollout = await self.store.enqueue_rollout(
                        task, config=CONFIGS[config_name], metadata={"soak": config_name, "kind": task["kind"]}
                    )
                    break
                except BackendError:  # the server is down (or died mid-call): not acknowledged, try again
                    self.acks.enqueue_retries += 1
                    await asyncio.sleep(0.5)
            self.acks.rollouts[rollout.rollout_id] = {
                "kind": task["kind"],
                "config": config_name,
                "acked_at": time.time(),
            }
            self.backlog += 1

    async def backlog_watch(self, load_end: float) -> None:
        while time.monotonic() < load_end:
            try:
                pending = await self.store.query_rollouts(status=NON_TERMINAL, limit=self.args.max_backlog + 1)
                self.backlog = len(pending)
            except BackendError:
                pass
            await asyncio.sleep(2.0)

    async def span_writer(self, load_end: float) -> None:
        """Every ~0.3 s: a batch of 1-3 spans into the latest attempt of a recent rollout; acknowledged ones noted."""
        rng = random.Random(self.args.seed + 1)
        while time.monotonic() < load_end:
            await asyncio.sleep(rng.uniform(0.1, 0.5))
            recent = list(self.acks.rollouts)[-30:]
            if not recent:
                continue
            rollout_id = rng.choice(recent)
            try:
                attempts = await self.store.query_attempts(rollout_id)
                if not attempts:
                    continue
                attempt = max(attempts, key=lambda a: a.sequence_id)
                now = time.time()
                spans = [
                    Span(
                        rollout_id=rollout_id,
                        attempt_id=attempt.attempt_id,
                        span_id=uuid.uuid4().hex[:16],
                        trace_id=uuid.uuid4().hex,
                        name="soak.driver",
                        start_time=now,
                        end_time=now,
                        attributes={"k": k, "text": "x" * rng.randint(0, 200)},
                    )
                    for k in range(rng.randint(1, 3))
                ]
                stored = await self.store.add_spans(spans)
            except BackendError:
                self.acks.span_write_failures["BackendError"] += 1
                continue
            except AgentboltError as exc:  # refused: not acknowledged
                self.acks.span_write_failures[type(exc).__name__] += 1
                continue
            self.acks.span_batches += 1
            self.acks.spans[(rollout_id, attempt.attempt_id)].update(s.span_id for s in stored)

    # ----------------------------------------------------------------- chaos
    async def chaos(self, load_end: float) -> None:
        rng = random.Random(self.args.seed + 2)
        while True:
            pause = rng.expovariate(1.0 / self.args.kill_every)
            if time.monotonic() + pause >= load_end:
                return
            await asyncio.sleep(pause)
            async with self.chaos_lock:
                if rng.random() < self.args.server_share:
                    self.kill_log.append((time.time(), "server"))
                    await self.cluster.kill_server()
                    self.kills["server"] += 1
                    await asyncio.sleep(rng.uniform(0.0, 2.0))
                    await self.cluster.start_server()
                else:
                    alive = [i for i, p in enumerate(self.cluster.runner_procs) if p is not None and p.poll() is None]
                    if not alive:
                        continue
                    i = rng.choice(alive)
                    self.kill_log.append((time.time(), f"soak-r{i}"))
                    await self.cluster.kill_runner(i)
                    self.kills["runner"] += 1
                    await asyncio.sleep(rng.uniform(0.0, 3.0))
                    self.cluster.start_runner(i)

    async def supervisor(self) -> None:
        """Restart runners that exited on their own (counted, with the end of their log)."""
        while not self.stopping:
            await asyncio.sleep(1.0)
            async with self.chaos_lock:
                for i, proc in enumerate(self.cluster.runner_procs):
                    if proc is None or proc.poll() is None or proc.pid in self.cluster.killed_by_us:
                        continue
                    self.runner_exits.append(
                        {
                            "runner": i,
                            "rc": proc.returncode,
                            "at_s": round(time.monotonic() - self.t0, 1),
                            "log_tail": tail(self.cluster.workdir / f"runner-{i}.log")
                            if len(self.runner_exits) < 5
                            else [],
                        }
                    )
                    print(f"  runner {i} exited by itself (rc {proc.returncode}); restarting", flush=True)
                    self.cluster.start_runner(i)

    async def progress(self, load_end: float) -> None:
        while time.monotonic() + 30.0 < load_end:
            await asyncio.sleep(30.0)
            print(
                f"  {time.monotonic() - self.t0:6.0f} s: {len(self.acks.rollouts)} rollouts acknowledged, "
                f"backlog {self.backlog}, kills {dict(self.kills)}, runner self-exits {len(self.runner_exits)}, "
                f"enqueue retries {self.acks.enqueue_retries}",
                flush=True,
            )

    # ----------------------------------------------------------------- drain and checks
    async def drain(self) -> tuple[float, int]:
        """Wait until no rollout is non-terminal (at most ``--drain-s``); the seconds it took and how many are left."""
        t = time.monotonic()
        deadline = t + self.args.drain_s
        left = -1
        while time.monotonic() < deadline:
            try:
                left = len(await self.store.query_rollouts(status=NON_TERMINAL))
            except BackendError:
                left = -1
            if left == 0:
                break
            await asyncio.sleep(1.0)
        return time.monotonic() - t, left

    async def _gather(self, coros: list[Any], limit: int = 8) -> list[Any]:
        sem = asyncio.Semaphore(limit)

        async def one(c: Any) -> Any:
            async with sem:
                return await c

        return await asyncio.gather(*(one(c) for c in coros))

    async def check(self) -> dict[str, Any]:
        store = self.store
        acked = list(self.acks.rollouts)
        found: dict[str, Rollout] = {}
        for i in range(0, len(acked), 200):
            for r in await store.query_rollouts(rollout_ids=acked[i : i + 200]):
                found[r.rollout_id] = r
        missing = [r for r in acked if r not in found]
        everything = await store.query_rollouts()
        by_id = {r.rollout_id: r for r in everything}
        unacked_stored = [r for r in by_id if r not in self.acks.rollouts]
        non_terminal = [r for r in everything if r.status not in TERMINAL]

        attempts_of: dict[str, list[Attempt]] = dict(
            zip(by_id, await self._gather([store.query_attempts(r) for r in by_id]), strict=True)
        )
        span_keys = [k for k in self.acks.spans if k[0] in by_id]
        spans_found = await self._gather([store.query_spans(r, a) for r, a in span_keys])
        spans_missing = 0
        for key, stored in zip(span_keys, spans_found, strict=True):
            spans_missing += len(self.acks.spans[key] - {s.span_id for s in stored})
        spans_missing += sum(len(v) for k, v in self.acks.spans.items() if k[0] not in by_id)
        spans_acked = sum(len(s) for s in self.acks.spans.values())

        final_status = Counter(r.status.value for r in everything)
        attempt_status: Counter[str] = Counter()
        attempt_cause: Counter[str] = Counter()
        attempt_cause_raw: Counter[str] = Counter()  # error["cause"] exactly as recorded
        by_kind: dict[str, Counter[str]] = defaultdict(Counter)
        violations: list[str] = []
        queue_waits: list[tuple[float, str, str]] = []  # (seconds, rollout id, cause of the attempt before)
        life_waits: list[tuple[float, str, str]] = []
        kill_waits: list[tuple[float, str, str]] = []  # a kill during the attempt -> claim of the next
        attempts_per_rollout: Counter[int] = Counter()
        for rollout_id, rollout in by_id.items():
            attempts = sorted(attempts_of[rollout_id], key=lambda a: a.sequence_id)
            attempts_per_rollout[len(attempts)] += 1
            for a in attempts:
                attempt_status[a.status.value] += 1
                if a.status not in ACTIVE_ATTEMPT and a.status != AttemptStatus.SUCCEEDED:
                    attempt_cause[cause_of(a)] += 1
                    attempt_cause_raw[
                        str((a.error or {}).get("cause") or f"(no cause; type {(a.error or {}).get('type')})")
                    ] += 1
            last = attempts[-1] if attempts else None
            last_cause = cause_of(last) if last is not None and last.status != AttemptStatus.SUCCEEDED else None
            kind = (rollout.metadata or {}).get("kind", "?")
            by_kind[kind][f"{rollout.status.value}/{last_cause or '-'}"] += 1
            if len(attempts) > rollout.config.max_attempts:
                violations.append(
                    f"{rollout_id}: {len(attempts)} attempts > max_attempts {rollout.config.max_attempts}"
                )
            if rollout.status in TERMINAL and any(a.status in ACTIVE_ATTEMPT for a in attempts):
                violations.append(f"{rollout_id}: {rollout.status.value} with an active attempt")
            if rollout.status == RolloutStatus.SUCCEEDED and not any(
                a.status == AttemptStatus.SUCCEEDED for a in attempts
            ):
                violations.append(f"{rollout_id}: succeeded but no attempt succeeded")
            if rollout.status == RolloutStatus.SUCCEEDED and rollout.final_reward is None:
                violations.append(f"{rollout_id}: succeeded with no final reward")
            for prev, nxt in zip(attempts, attempts[1:], strict=False):
                cause = cause_of(prev)
                if prev.end_time is not None:
                    queue_waits.append((nxt.start_time - prev.end_time, rollout_id, cause))
                life_waits.append((nxt.start_time - last_alive(prev, rollout.config), rollout_id, cause))
                end = prev.end_time if prev.end_time is not None else nxt.start_time
                kills = [
                    t for t, who in self.kill_log if who in ("server", prev.worker_id) and prev.start_time <= t <= end
                ]
                if kills:
                    kill_waits.append((nxt.start_time - min(kills), rollout_id, cause))

        def wait_figures(waits: list[tuple[float, str, str]]) -> dict[str, Any]:
            values = [w[0] for w in waits]
            worst = max(waits, default=None)
            return {
                "retries": len(values),
                "p50_s": pct(values, 0.5),
                "p99_s": pct(values, 0.99),
                "max_s": round(worst[0], 3) if worst else None,
                "max_rollout": worst[1] if worst else None,
                "max_after_cause": worst[2] if worst else None,
                "mean_s": round(statistics.fmean(values), 3) if values else None,
            }

        durations = [r.end_time - r.enqueue_time for r in everything if r.end_time is not None]
        return {
            "acked_rollouts": len(acked),
            "acked_rollouts_missing": len(missing),
            "acked_rollouts_missing_ids": missing[:20],
            "unacked_rollouts_in_store": len(unacked_stored),
            "rollouts_in_store": len(everything),
            "acked_span_batches": self.acks.span_batches,
            "acked_spans": spans_acked,
            "acked_spans_missing": spans_missing,
            "non_terminal": len(non_terminal),
            "non_terminal_examples": [
                {
                    "rollout": r.model_dump(mode="json", include={"rollout_id", "status", "config", "metadata"}),
                    "attempts": [a.model_dump(mode="json", exclude={"error"}) for a in attempts_of[r.rollout_id]],
                }
                for r in non_terminal[:5]
            ],
            "invariant_violations": len(violations),
            "invariant_violation_examples": violations[:20],
            "final_status": dict(final_status),
            "attempt_status": dict(attempt_status),
            "attempt_cause": dict(attempt_cause),
            "attempt_error_cause_as_recorded": dict(attempt_cause_raw),
            "attempts_per_rollout": {str(k): v for k, v in sorted(attempts_per_rollout.items())},
            "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
            "retry_wait_end_to_claim": wait_figures(queue_waits),
            "retry_wait_last_life_to_claim": wait_figures(life_waits),
            "retry_wait_kill_to_claim": wait_figures(kill_waits),
            "enqueue_to_end_s": {"p50": pct(durations, 0.5), "p99": pct(durations, 0.99), "max": pct(durations, 1.0)},
        }

    # ----------------------------------------------------------------- main
    async def run(self) -> dict[str, Any]:
        args, cluster = self.args, self.cluster
        print(
            f"soak: {args.minutes} min, seed {args.seed}, workdir {cluster.workdir}, server {cluster.url}", flush=True
        )
        self.t0 = time.monotonic()
        await cluster.start_server(create=True)
        for i in range(args.runners):
            cluster.start_runner(i)
        load_end = time.monotonic() + args.minutes * 60.0
        supervisor = asyncio.create_task(self.supervisor())
        loops = [
            self.producer(load_end),
            self.backlog_watch(load_end),
            self.span_writer(load_end),
            self.chaos(load_end),
            self.progress(load_end),
        ]
        await asyncio.gather(*loops)
        load_s = time.monotonic() - self.t0
        for i, proc in enumerate(cluster.runner_procs):  # every runner up for the drain
            if proc is None:
                cluster.start_runner(i)
        print(f"  load over after {load_s:.0f} s; draining (at most {args.drain_s:.0f} s)", flush=True)
        drain_s, left = await self.drain()
        print(f"  drained in {drain_s:.0f} s ({left} non-terminal); final server SIGKILL + restart", flush=True)
        async with self.chaos_lock:
            await cluster.kill_server()
            self.kills["server_final"] += 1
            await cluster.start_server()
        acks = {"rollouts": self.acks.rollouts, "spans": [[*k, sorted(v)] for k, v in self.acks.spans.items()]}
        (cluster.workdir / "acks.json").write_text(json.dumps(acks))  # to check again by hand if need be
        try:
            figures = await self.check()
        finally:
            self.stopping = True
            supervisor.cancel()
            await self.store.close()
            await cluster.stop()
        await asyncio.sleep(1.0)
        leftovers = cluster.leftover_groups()
        cluster.kill_leftovers()
        cluster.close_logs()
        downtimes = cluster.server_downtime_s[1:]  # the first is the cold start
        figures.update(
            {
                "minutes": args.minutes,
                "seed": args.seed,
                "runners": args.runners,
                "concurrency": args.concurrency,
                "rate_target_per_s": args.rate,
                "load_s": round(load_s, 1),
                "drain_s": round(drain_s, 1),
                "kills": dict(self.kills),
                "runner_self_exits": len(self.runner_exits),
                "runner_self_exit_examples": self.runner_exits[:5],
                "server_starts": cluster.server_starts,
                "server_start_failures": cluster.server_start_failures,
                "server_downtime_s": {
                    "total": round(sum(downtimes), 1),
                    "max": round(max(downtimes), 1) if downtimes else None,
                    "mean": round(statistics.fmean(downtimes), 1) if downtimes else None,
                },
                "enqueue_retries": self.acks.enqueue_retries,
                "span_write_failures": dict(self.acks.span_write_failures),
                "leftover_process_groups": len(leftovers),
                "rollouts_per_s": round(len(self.acks.rollouts) / load_s, 3),
                "workdir": str(cluster.workdir),
            }
        )
        return figures


def report(f: dict[str, Any]) -> None:
    q, life, kill = f["retry_wait_end_to_claim"], f["retry_wait_last_life_to_claim"], f["retry_wait_kill_to_claim"]
    lines = [
        f"soak {f['minutes']} min (seed {f['seed']}; {f['runners']} runners x {f['concurrency']} slots; "
        f"load {f['load_s']} s, drain {f['drain_s']} s)",
        f"  acknowledged rollouts missing : {f['acked_rollouts_missing']} of {f['acked_rollouts']}",
        f"  acknowledged spans missing    : {f['acked_spans_missing']} of {f['acked_spans']} "
        f"({f['acked_span_batches']} batches)",
        f"  rollouts left non-terminal    : {f['non_terminal']} of {f['rollouts_in_store']} in the store "
        f"({f['unacked_rollouts_in_store']} not acknowledged to the driver)",
        f"  store invariant violations    : {f['invariant_violations']}",
        f"  longest retry wait            : {q['max_s']} s end of attempt -> claim of retry "
        f"(after {q['max_after_cause']}; p50 {q['p50_s']} s, p99 {q['p99_s']} s, {q['retries']} retries); "
        f"{life['max_s']} s last sign of life -> claim (after {life['max_after_cause']}; p99 {life['p99_s']} s); "
        f"{kill['max_s']} s kill -> claim (after {kill['max_after_cause']}; p50 {kill['p50_s']} s, "
        f"{kill['retries']} retries after a kill)",
        f"  kills                         : {f['kills']}; runner self-exits {f['runner_self_exits']}; "
        f"leftover process groups {f['leftover_process_groups']}",
        f"  server downtime               : {f['server_downtime_s']} (starts {f['server_starts']}, "
        f"failed starts {f['server_start_failures']}); enqueue retries {f['enqueue_retries']}",
        f"  rollouts/s                    : {f['rollouts_per_s']} (target {f['rate_target_per_s']})",
        f"  final status                  : {f['final_status']}",
        f"  attempt status                : {f['attempt_status']}",
        f"  attempt cause                 : {f['attempt_cause']}",
        f"  error.cause as recorded       : {f['attempt_error_cause_as_recorded']}",
        f"  attempts per rollout          : {f['attempts_per_rollout']}",
        f"  enqueue -> end (s)            : {f['enqueue_to_end_s']}",
        "  by kind (final status/cause of last attempt):",
    ]
    lines += [f"    {k:7s} {v}" for k, v in f["by_kind"].items()]
    if f["invariant_violation_examples"]:
        lines += ["  violations:"] + [f"    {v}" for v in f["invariant_violation_examples"]]
    print("\n".join(lines), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=30.0, help="load time (the drain and checks come after)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rate", type=float, default=1.5, help="rollouts enqueued per second")
    p.add_argument("--max-backlog", type=int, default=40, help="pause enqueuing above this many non-terminal")
    p.add_argument("--runners", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=3, help="slots per runner")
    p.add_argument("--kill-every", type=float, default=20.0, help="mean seconds between two kills")
    p.add_argument("--server-share", type=float, default=0.25, help="share of the kills that hit the server")
    p.add_argument("--drain-s", type=float, default=240.0, help="longest wait for every rollout to end")
    p.add_argument("--dir", default=None, help="work folder (store, logs); default a new temporary folder")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args()
    figures = asyncio.run(Soak(args).run())
    report(figures)
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))
        print(f"figures written to {args.out}")


if __name__ == "__main__":
    main()
