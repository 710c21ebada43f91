"""Load generator for the kill -9 durability test (``tests/integration/test_durability.py``).

:func:`run_load` drives a running ``agentbolt serve`` through :class:`~agentbolt.client.HttpLightningStore` from
several asyncio tasks (producers enqueueing rollouts, consumers claiming, starting, adding spans and finishing or
abandoning them, one writer of resources versions) and records in an :class:`AckLog` every write the server
acknowledged, i.e. every call that returned. Every task stops after the first connection error (the server is
gone); a write whose call did not return is not recorded.

Run as a script, it is the test's second OS process: ``python durability_load.py URL OUT_JSON TAG MAX_S``. It
touches ``OUT_JSON.ready`` once the server answered, loads until the server goes away (or ``MAX_S`` pass), then
writes its log to ``OUT_JSON``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agentbolt.client import HttpLightningStore
from agentbolt.errors import AgentboltError, BackendError
from agentbolt.store.base import EnqueueRequest
from agentbolt.types import LLM, AttemptStatus, PromptTemplate, RolloutConfig, Span

LEASE_S = 1.5
"""``unresponsive_seconds`` of every rollout: an attempt with no span or heartbeat for this long is expired."""

TIMEOUT_S = 2.5
"""``timeout_seconds`` of the rollouts that have one."""

MAX_LEASE_S = max(LEASE_S, TIMEOUT_S)

CONFIGS: tuple[RolloutConfig, ...] = (
    RolloutConfig(max_attempts=1, unresponsive_seconds=LEASE_S),
    RolloutConfig(max_attempts=2, unresponsive_seconds=LEASE_S),
    RolloutConfig(max_attempts=3, unresponsive_seconds=LEASE_S, timeout_seconds=TIMEOUT_S),
)

MAX_BACKLOG = 40
"""A producer pauses while its process enqueued this many more rollouts than it claimed."""

ABANDON_P = 0.2
"""Share of claimed attempts a consumer drops without ending them (their lease must expire)."""

FAIL_P = 0.15
"""Share of claimed attempts a consumer ends ``failed``; the rest end ``succeeded`` with a reward."""


@dataclass
class AckLog:
    """Every acknowledged write of one load run, as JSON-compatible data.

    Attributes:
        rollouts: rollout id -> the rollout as the enqueue call returned it.
        claims: attempt id -> ``{"rollout_id", "sequence_id", "acked_at"}`` of each claim that returned.
        running: attempt ids whose move to ``running`` returned.
        finished: attempt id -> ``{"rollout_id", "status", "final_reward", "acked_at"}`` of each end that returned.
        spans: spans as ``add_span``/``add_spans`` returned them (with their store-assigned ``sequence_id``).
        resources: resources versions as ``add_resources`` returned them.
        errors: count of refused or failed calls by exception type (not acknowledged, not checked).
    """

    rollouts: dict[str, dict[str, Any]] = field(default_factory=dict)
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)
    finished: dict[str, dict[str, Any]] = field(default_factory=dict)
    spans: list[dict[str, Any]] = field(default_factory=list)
    resources: list[dict[str, Any]] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def writes(self) -> int:
        """How many acknowledged writes the log holds (each rollout, claim, status move, span, version)."""
        return (
            len(self.rollouts)
            + len(self.claims)
            + len(self.running)
            + len(self.finished)
            + len(self.spans)
            + len(self.resources)
        )

    def summary(self) -> str:
        return (
            f"{self.writes()} acknowledged writes: {len(self.rollouts)} rollouts, {len(self.claims)} claims, "
            f"{len(self.running)} starts, {len(self.finished)} ends, {len(self.spans)} spans, "
            f"{len(self.resources)} resources versions (refused/failed calls: {dict(self.errors)})"
        )

    def merge(self, other: AckLog) -> None:
        self.rollouts.update(other.rollouts)
        self.claims.update(other.claims)
        self.running |= other.running
        self.finished.update(other.finished)
        self.spans += other.spans
        self.resources += other.resources
        self.errors += other.errors

    def dump(self, path: Path) -> None:
        data = {
            "rollouts": self.rollouts,
            "claims": self.claims,
            "running": sorted(self.running),
            "finished": self.finished,
            "spans": self.spans,
            "resources": self.resources,
            "errors": dict(self.errors),
        }
        path.write_text(json.dumps(data))

    @classmethod
    def load(cls, path: Path) -> AckLog:
        data = json.loads(path.read_text())
        return cls(
            rollouts=data["rollouts"],
            claims=data["claims"],
            running=set(data["running"]),
            finished=data["finished"],
            spans=data["spans"],
            resources=data["resources"],
            errors=Counter(data["errors"]),
        )


def make_span(rollout_id: str, attempt_id: str, worker_id: str, k: int, rng: random.Random) -> Span:
    now = time.time()
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        span_id=uuid.uuid4().hex[:16],
        trace_id=uuid.uuid4().hex,
        name="agentbolt.durability",
        start_time=now,
        end_time=now,
        attributes={
            "worker": worker_id,
            "k": k,
            "token_ids": [rng.randrange(50_000) for _ in range(rng.randint(0, 64))],
            "text": "x" * rng.randint(0, 300),
            "reward": rng.random(),
        },
    )


async def run_load(url: str, tag: str, log: AckLog, *, seed: int, max_s: float, consumers: int = 4) -> None:
    """Load the server at ``url`` until every task has hit a connection error or ``max_s`` seconds passed.

    Writes that return are recorded in ``log`` as they return. Refusals (lease expired, illegal move, ...) are
    counted in ``log.errors``; any other exception propagates.
    """
    rng = random.Random(seed)
    deadline = time.monotonic() + max_s
    backlog = 0  # rollouts this process enqueued minus rollouts it claimed
    numbers = itertools.count()
    store = HttpLightningStore(url, timeout_s=10.0)

    async def producer(p: int) -> None:
        nonlocal backlog
        if backlog > MAX_BACKLOG:
            await asyncio.sleep(0.02)
            return
        requests = [
            EnqueueRequest(
                input={"tag": tag, "producer": p, "n": n, "text": "q" * rng.randint(0, 200)},
                config=rng.choice(CONFIGS),
                metadata={"task_id": f"{tag}-{n % 7}"},
            )
            for n in itertools.islice(numbers, rng.choice((1, 1, 1, 3)))
        ]
        if len(requests) == 1:
            r = requests[0]
            done = [await store.enqueue_rollout(r.input, config=r.config, metadata=r.metadata)]
        else:
            done = await store.enqueue_many(requests)
        for rollout in done:
            log.rollouts[rollout.rollout_id] = rollout.model_dump(mode="json")
        backlog += len(done)

    async def consumer(c: int) -> None:
        nonlocal backlog
        worker_id = f"{tag}-w{c}"
        claimed = await store.claim_rollout(worker_id)
        if claimed is None:
            await asyncio.sleep(0.02)
            return
        rollout_id, attempt_id = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        log.claims[attempt_id] = {
            "rollout_id": rollout_id,
            "sequence_id": claimed.attempt.sequence_id,
            "acked_at": time.time(),
        }
        backlog -= 1
        await store.update_attempt(rollout_id, attempt_id, AttemptStatus.RUNNING)
        log.running.add(attempt_id)
        for k in range(rng.randint(1, 4)):
            if rng.random() < 0.25:
                spans = [make_span(rollout_id, attempt_id, worker_id, k * 10 + j, rng) for j in range(2)]
                stored = await store.add_spans(spans)
            else:
                stored = [await store.add_span(make_span(rollout_id, attempt_id, worker_id, k, rng))]
            log.spans += [s.model_dump(mode="json") for s in stored]
        roll = rng.random()
        if roll < ABANDON_P:
            return
        if roll < ABANDON_P + FAIL_P:
            status, reward = AttemptStatus.FAILED, None
            error: dict[str, Any] | None = {"type": "ValueError", "message": f"{worker_id} gave up"}
        else:
            status, reward, error = AttemptStatus.SUCCEEDED, round(rng.random(), 6), None
        await store.update_attempt(rollout_id, attempt_id, status, error=error, final_reward=reward)
        log.finished[attempt_id] = {
            "rollout_id": rollout_id,
            "status": status.value,
            "final_reward": reward,
            "acked_at": time.time(),
        }

    async def resources_writer() -> None:
        i = len(log.resources)
        update = await store.add_resources(
            {
                "prompt": PromptTemplate(template=f"[{tag} v{i}] solve: {{question}}"),
                "llm": LLM(endpoint="http://127.0.0.1:9/v1", model=f"{tag}-m{i}", sampling_parameters={"t": i}),
            },
            metadata={"writer": tag, "i": i},
        )
        log.resources.append(update.model_dump(mode="json"))
        await asyncio.sleep(0.03)

    server_gone = False

    async def forever(step: Any, *args: Any) -> None:
        nonlocal server_gone
        while not server_gone and time.monotonic() < deadline:
            try:
                await step(*args)
            except BackendError:  # the server died mid-call: not acknowledged
                server_gone = True  # every task stops; the calls in flight were not acknowledged
            except AgentboltError as exc:  # refused (e.g. the lease expired meanwhile): not acknowledged
                log.errors[type(exc).__name__] += 1

    try:
        tasks = [forever(producer, p) for p in range(2)]
        tasks += [forever(consumer, c) for c in range(consumers)]
        tasks.append(forever(resources_writer))
        await asyncio.gather(*tasks)
    finally:
        await store.close()


async def _peer_main(url: str, out: Path, tag: str, max_s: float) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as client:
        (await client.get("/v1/health")).raise_for_status()
    out.with_name(out.name + ".ready").touch()
    log = AckLog()
    try:
        await run_load(url, tag, log, seed=sum(map(ord, tag)), max_s=max_s)
    finally:
        log.dump(out)


if __name__ == "__main__":
    _url, _out, _tag, _max_s = sys.argv[1:5]
    asyncio.run(_peer_main(_url, Path(_out), _tag, float(_max_s)))
