"""An acknowledged write survives ``kill -9`` of the server, and no rollout is left stuck (DESIGN.md, "The store").

A real ``agentbolt serve`` process over a SQLite file is put under concurrent load by this process and by a second
OS process (``durability_load.py``: producers, consumers, a resources writer), each recording every write whose
call returned. The server is killed with SIGKILL while requests are in flight, restarted on the same file, and
checked:

1. every acknowledged rollout, claim (attempt), start, end, span and resources version is there, unchanged;
2. without any claim, the background lease sweep ends every attempt the dead server left active, and every rollout
   is in a state the lifecycle allows after expiry (requeued while attempts remain, failed when none do);
3. a new consumer drains the queue, every rollout ends terminal, and the acknowledged ends are still unchanged.

The load is short (a few seconds) and every lease is 1.5-2.5 s, so the test takes well under 30 s.

A server's store is never moved or replaced under it: while ``agentbolt serve`` holds ``D/store.db``,
``agentbolt train --out D --overwrite`` (which would move it aside), a plain ``train --out D`` on its still empty
store (which would replace it) and ``train --out D --resume`` (which would share it and cancel its rollouts) are
refused with exit code 2, naming the server's pid; every rollout the server acknowledged, before and after, is in
the file. Once the server is gone, ``--overwrite`` moves the old store aside (``D/.overwritten-<time>/``), intact.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from tests.integration.durability_load import LEASE_S, MAX_LEASE_S, AckLog, run_load

from agentbolt.client import HttpLightningStore
from agentbolt.types import (
    TERMINAL_ATTEMPT_STATUSES,
    TERMINAL_ROLLOUT_STATUSES,
    AttemptStatus,
    Rollout,
    RolloutStatus,
)

LOAD_S = 2.5
"""Seconds of load before the kill."""

PEER_MAX_S = 25.0
"""Safety stop of the second load process, should it never see the server die."""

SWEEP_GRACE_S = 3.0
"""Allowed delay, past the longest lease, for the sweep of the restarted server to end the dead server's leases."""

LOAD_SCRIPT = Path(__file__).with_name("durability_load.py")
REPO_ROOT = Path(__file__).resolve().parents[2]
ACTIVE = (RolloutStatus.PREPARING.value, RolloutStatus.RUNNING.value)


def server_argv(db: Path) -> list[str]:
    """The command that runs the server over the SQLite file ``db`` on a free loopback port."""
    store = ["--store", f"sqlite:///{db}", "--create"]
    return [sys.executable, "-m", "agentbolt.cli.main", "serve", *store, "--port", "0"]


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="250")  # the URL line must reach the log file whole
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


@contextlib.contextmanager
def running_server(db: Path, log: Path) -> Iterator[Server]:
    """Start the server, wait until ``/v1/health`` answers, and stop it (if still alive) on exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen(server_argv(db), stdout=out, stderr=subprocess.STDOUT, env=_env())
    try:
        deadline = time.monotonic() + 30
        url = None
        while url is None:
            assert proc.poll() is None, f"server exited ({proc.returncode}): {log.read_text()}"
            assert time.monotonic() < deadline, f"server did not start: {log.read_text()}"
            found = re.search(r"http://127\.0\.0\.1:\d+", log.read_text())
            url = found.group(0) if found else None
            time.sleep(0.05)
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/v1/health", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, f"server at {url} never became healthy: {log.read_text()}"
            time.sleep(0.05)
        yield Server(proc, url, log)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _load_then_kill(server: Server) -> tuple[AckLog, float]:
    """Load the server from this process for LOAD_S seconds, SIGKILL it mid-load, let the load tasks stop."""
    log = AckLog()
    load = asyncio.create_task(run_load(server.url, "local", log, seed=7, max_s=LOAD_S + 20))
    await asyncio.sleep(LOAD_S)
    assert not load.done(), f"the load stopped before the kill: {load}"
    kill_time = time.time()
    os.kill(server.proc.pid, signal.SIGKILL)
    await asyncio.wait_for(load, timeout=20)  # the load stops at its first connection error
    return log, kill_time


def _active_in_file(db: Path) -> tuple[list[str], list[str]]:
    """Rollout and attempt ids in ``preparing``/``running``, read straight from the file (no expiry on read)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        marks = ", ".join("?" * len(ACTIVE))
        rollouts = [r for (r,) in conn.execute(f"SELECT rollout_id FROM rollouts WHERE status IN ({marks})", ACTIVE)]
        attempts = [a for (a,) in conn.execute(f"SELECT attempt_id FROM attempts WHERE status IN ({marks})", ACTIVE)]
    finally:
        conn.close()
    return rollouts, attempts


async def _gather_chunked(coros: list[Any], size: int = 8) -> list[Any]:
    out: list[Any] = []
    for start in range(0, len(coros), size):
        out += await asyncio.gather(*coros[start : start + size])
    return out


def _allowed_after_expiry(rollout: Rollout, latest: AttemptStatus | None) -> str | None:
    """Why ``rollout`` (its latest attempt ending ``latest``) is not a state the lifecycle allows; None if it is."""
    cfg, n = rollout.config, rollout.num_attempts
    match rollout.status:
        case RolloutStatus.QUEUING:
            return None if n == 0 and latest is None else "queuing with attempts"
        case RolloutStatus.REQUEUING:
            ok = latest in cfg.retry_on and n < cfg.max_attempts
            return None if ok else f"requeuing after {latest} with {n}/{cfg.max_attempts} attempts"
        case RolloutStatus.SUCCEEDED:
            return None if latest == AttemptStatus.SUCCEEDED else f"succeeded, latest attempt {latest}"
        case RolloutStatus.FAILED:
            retryable = latest in cfg.retry_on and n < cfg.max_attempts
            ok = latest in TERMINAL_ATTEMPT_STATUSES - {AttemptStatus.SUCCEEDED} and not retryable
            return None if ok else f"failed after {latest} with {n}/{cfg.max_attempts} attempts"
        case _:
            return f"{rollout.status.value} (stuck, or never expected here)"


def _terminal(rollout: Rollout) -> bool:
    return rollout.status in TERMINAL_ROLLOUT_STATUSES


async def _check_after_restart(url: str, db: Path, acks: AckLog, kill_time: float) -> dict[str, int]:
    store = HttpLightningStore(url, timeout_s=30.0)
    stats: dict[str, int] = {}
    try:
        # --- resources: every acknowledged version, unchanged (a read that expires nothing: the sweep stays alone)
        versions = {r.resources_id: r.model_dump(mode="json") for r in await store.query_resources()}
        lost = [r["resources_id"] for r in acks.resources if r["resources_id"] not in versions]
        assert not lost, f"{len(lost)} of {len(acks.resources)} acknowledged resources versions lost: {lost[:5]}"
        for acked in acks.resources:
            assert versions[acked["resources_id"]] == acked, f"resources version changed: {acked}"
        numbers = sorted(v["version"] for v in versions.values())
        assert numbers == list(range(1, len(numbers) + 1)), f"resources versions with gaps: {numbers}"

        # --- no rollout stuck: the background sweep alone (no claim, no read of rollouts) ends the dead leases
        deadline = max(kill_time + MAX_LEASE_S + SWEEP_GRACE_S, time.time() + 2.0)
        while (active := _active_in_file(db)) != ([], []) and time.time() < deadline:
            await asyncio.sleep(0.1)
        assert active == ([], []), (
            f"{len(active[0])} rollouts / {len(active[1])} attempts still preparing/running "
            f"{time.time() - kill_time:.1f}s after the kill (leases of {MAX_LEASE_S}s): {active[0][:5]} {active[1][:5]}"
        )

        # --- rollouts: every acknowledged one is there, as enqueued, in a state allowed after expiry
        rollouts = {r.rollout_id: r for r in await store.query_rollouts()}
        missing = sorted(set(acks.rollouts) - set(rollouts))
        assert not missing, f"{len(missing)} of {len(acks.rollouts)} acknowledged rollouts lost: {missing[:5]}"
        for rid, acked in acks.rollouts.items():
            got = rollouts[rid].model_dump(mode="json")
            for key in ("input", "config", "metadata", "mode", "enqueue_time"):
                assert got[key] == acked[key], f"rollout {rid}: {key} {got[key]!r} != acknowledged {acked[key]!r}"
        ids = list(rollouts)
        attempts = dict(zip(ids, await _gather_chunked([store.query_attempts(r) for r in ids]), strict=True))
        bad = []
        for rid, rollout in rollouts.items():
            atts = attempts[rid]
            assert [a.sequence_id for a in atts] == list(range(1, rollout.num_attempts + 1)), f"{rid} attempts"
            assert all(a.status in TERMINAL_ATTEMPT_STATUSES for a in atts), f"{rid} has an active attempt"
            why = _allowed_after_expiry(rollout, atts[-1].status if atts else None)
            if why is not None:
                bad.append(f"{rid}: {why}")
        assert not bad, f"{len(bad)} rollouts in a state the lifecycle does not allow after expiry: {bad[:5]}"
        by_status = defaultdict(int)
        for r in rollouts.values():
            by_status[r.status.value] += 1
        stats.update({f"after_sweep_{k}": v for k, v in sorted(by_status.items())})

        # --- attempts: every acknowledged claim, start and end
        found = {a.attempt_id: a for atts in attempts.values() for a in atts}
        lost = sorted(set(acks.claims) - set(found))
        assert not lost, f"{len(lost)} of {len(acks.claims)} acknowledged claims lost: {lost[:5]}"
        for aid, claim in acks.claims.items():
            assert (found[aid].rollout_id, found[aid].sequence_id) == (claim["rollout_id"], claim["sequence_id"])
        unstarted = sorted(a for a in acks.running if found[a].status == AttemptStatus.PREPARING)
        assert not unstarted, f"acknowledged starts lost: {unstarted[:5]}"
        # attempts a worker held when the server died (claimed less than a lease before, not ended): the sweep of
        # the restarted server must have ended them (an end that was in flight at the kill may have landed too)
        held = [
            aid
            for aid, claim in acks.claims.items()
            if aid not in acks.finished and claim["acked_at"] > kill_time - LEASE_S + 0.2
        ]
        expired = [a for a in held if found[a].status in (AttemptStatus.TIMEOUT, AttemptStatus.UNRESPONSIVE)]
        stats["held_at_kill"], stats["expired_after_restart"] = len(held), len(expired)
        for aid, end in acks.finished.items():
            rollout = rollouts[end["rollout_id"]]
            assert found[aid].status.value == end["status"], f"attempt {aid}: {found[aid].status} != {end}"
            assert rollout.status.value == end["status"], f"rollout {rollout.rollout_id}: {rollout.status} != {end}"
            assert rollout.final_reward == end["final_reward"], f"rollout {rollout.rollout_id} reward {end}"

        # --- spans: every acknowledged one, with its store-assigned sequence number and equal attributes
        wanted: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for span in acks.spans:
            wanted[(span["rollout_id"], span["attempt_id"])].append(span)
        keys = list(wanted)
        stored = await _gather_chunked([store.query_spans(rid, aid) for rid, aid in keys])
        for key, spans in zip(keys, stored, strict=True):
            by_id = {s.span_id: s.model_dump(mode="json") for s in spans}
            assert [s.sequence_id for s in spans] == list(range(1, len(spans) + 1)), f"span numbering of {key}"
            for acked in wanted[key]:
                assert by_id.get(acked["span_id"]) == acked, f"acknowledged span lost or changed: {acked}"

        # --- drain: a new consumer claims everything left and finishes it; then every rollout is terminal
        drained = 0

        async def drain(worker: str) -> None:
            nonlocal drained
            while (claimed := await store.claim_rollout(worker)) is not None:
                rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
                await store.update_attempt(rid, aid, AttemptStatus.RUNNING)
                await store.update_attempt(rid, aid, AttemptStatus.SUCCEEDED, final_reward=1.0)
                drained += 1

        await asyncio.gather(*(drain(f"drainer-{i}") for i in range(4)))
        stats["drained"] = drained
        final = {r.rollout_id: r for r in await store.query_rollouts()}
        assert final.keys() == rollouts.keys()
        not_done = [f"{r.rollout_id}: {r.status.value}" for r in final.values() if not _terminal(r)]
        assert not not_done, f"{len(not_done)} rollouts not terminal after the drain: {not_done[:5]}"
        for end in acks.finished.values():
            assert final[end["rollout_id"]].status.value == end["status"], f"acknowledged end changed: {end}"
        stats["rollouts"] = len(final)
    finally:
        await store.close()
    return stats


def test_acknowledged_writes_survive_kill_9_and_no_rollout_is_stuck(tmp_path: Path) -> None:
    started = time.monotonic()
    db = tmp_path / "store.db"
    peer_out = tmp_path / "peer.json"
    with running_server(db, tmp_path / "server-1.log") as server:
        peer_log = (tmp_path / "peer.log").open("wb")
        peer = subprocess.Popen(
            [sys.executable, str(LOAD_SCRIPT), server.url, str(peer_out), "peer", str(PEER_MAX_S)],
            stdout=peer_log,
            stderr=subprocess.STDOUT,
            env=_env(),
        )
        try:
            ready = peer_out.with_name(peer_out.name + ".ready")
            deadline = time.monotonic() + 30
            while not ready.exists():
                assert peer.poll() is None, f"load process died: {(tmp_path / 'peer.log').read_text()}"
                assert time.monotonic() < deadline, "load process never started"
                time.sleep(0.05)
            acks, kill_time = asyncio.run(_load_then_kill(server))
            assert server.proc.wait(timeout=10) == -signal.SIGKILL
            assert peer.wait(timeout=30) == 0, f"load process failed: {(tmp_path / 'peer.log').read_text()}"
        finally:
            if peer.poll() is None:
                peer.kill()
                peer.wait()
            peer_log.close()
    peer_acks = AckLog.load(peer_out)
    assert peer_acks.writes() > 0, f"the second process acknowledged nothing: {peer_acks.summary()}"
    acks.merge(peer_acks)
    assert len(acks.rollouts) >= 20 and len(acks.spans) >= 20 and len(acks.resources) >= 3, acks.summary()

    with running_server(db, tmp_path / "server-2.log") as server:
        try:
            stats = asyncio.run(_check_after_restart(server.url, db, acks, kill_time))
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n(checked after a kill -9 under load; {acks.summary()})") from None
    assert stats["expired_after_restart"] > 0, f"no lease was left for the restarted server to expire: {stats}"
    print(f"\nkill -9 durability: {acks.summary()}; checked after restart: {stats}; {time.monotonic() - started:.1f}s")


# ------------------------------------------------------------------ a served store is never moved or replaced

NOT_A_MODEL_CONFIG = """\
model: {model}
agent: examples.calc_agent.agent:calc_agent
tasks: examples.calc_agent.tasks
train_size: 4
val_size: 0
grpo:
  steps: 1
  tasks_per_step: 1
  group_size: 2
"""
"""A train job whose model is a folder without a model: it fails when the model loads, right after the store is
prepared (so on a build that replaces a served store, the damage is done before it fails)."""


def _train(config: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "agentbolt.cli.main", "train", str(config), "--out", str(out), *extra]
    return subprocess.run(cmd, cwd=REPO_ROOT, env=_env(), capture_output=True, text=True, timeout=180)


def _post_rollouts(url: str, n: int, tag: str) -> list[str]:
    """Enqueue ``n`` rollouts through the server; return the ids it acknowledged."""
    ids = []
    with httpx.Client(base_url=url, timeout=10) as client:
        for i in range(n):
            resp = client.post("/v1/rollouts", json={"input": {"tag": tag, "i": i}})
            assert resp.status_code in (200, 201), resp.text
            ids.append(resp.json()["rollout_id"])
    return ids


def _rollout_ids_in(db: Path) -> set[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return {r for (r,) in conn.execute("SELECT rollout_id FROM rollouts")}
    finally:
        conn.close()


def _refused_naming(done: subprocess.CompletedProcess[str], server: Server) -> None:
    text = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, text
    assert "is open in another process" in text and f"pid {server.proc.pid}" in text, text
    assert "agentbolt.cli.main serve" in text and "Traceback" not in text, text


def test_train_overwrite_refuses_a_served_store_then_moves_it_aside(tmp_path: Path) -> None:
    out = tmp_path / "D"
    db = out / "store.db"
    config = tmp_path / "job.yaml"
    (tmp_path / "not-a-model").mkdir()
    config.write_text(NOT_A_MODEL_CONFIG.format(model=tmp_path / "not-a-model"))
    with running_server(db, tmp_path / "server.log") as server:
        acked = _post_rollouts(server.url, 10, "before")
        done = _train(config, out, "--overwrite")
        _refused_naming(done, server)
        assert "--overwrite would move it aside" in " ".join(done.stderr.split())
        acked += _post_rollouts(server.url, 10, "after")  # the server still writes into the file in D
        with httpx.Client(base_url=server.url) as client:
            assert len(client.get("/v1/rollouts").json()) == 20
    assert server.proc.returncode == 0, server.log.read_text()
    assert _rollout_ids_in(db) == set(acked), "acknowledged rollouts missing from D/store.db"

    # The server is gone: --overwrite goes ahead, and moves the old store aside instead of deleting it.
    done = _train(config, out, "--overwrite")
    text = " ".join((done.stdout + done.stderr).split())
    assert "moved the previous run's files" in text, text
    moved = sorted(out.glob(".overwritten-*"))
    assert len(moved) == 1 and str(moved[0]) in text, text
    assert _rollout_ids_in(moved[0] / "store.db") == set(acked)
    assert not db.exists(), "the failed job left a store behind"


def test_a_job_never_takes_the_store_of_a_running_server(tmp_path: Path) -> None:
    """Serve + train on one file: the job refuses (a plain run would replace the server's still empty store, a
    resume would share it and cancel its rollouts); the server goes on without losing anything."""
    out = tmp_path / "D"
    db = out / "store.db"
    config = tmp_path / "job.yaml"
    (tmp_path / "not-a-model").mkdir()
    config.write_text(NOT_A_MODEL_CONFIG.format(model=tmp_path / "not-a-model"))
    with running_server(db, tmp_path / "server.log") as server:
        _refused_naming(_train(config, out), server)  # no rollout in the store yet: today's rule would replace it
        acked = _post_rollouts(server.url, 5, "served")
        _refused_naming(_train(config, out, "--resume"), server)
        acked += _post_rollouts(server.url, 5, "served-after")
    assert server.proc.returncode == 0, server.log.read_text()
    assert _rollout_ids_in(db) == set(acked), "acknowledged rollouts missing from D/store.db"
    assert not list(out.glob(".overwritten-*"))
