"""The stores under test in ``store_workload.py``: the adapter contract of the workload and its implementations.

One adapter class per implementation and mode (in-process or client-server); one instance per OS process. The
agentbolt adapters import agentbolt, the agent-lightning ones ``agentlightning``, both only when a run opens them, so
the harness itself stays standard-library only and runs under either implementation's Python.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple


class Claim(NamedTuple):
    rollout_id: str
    attempt_id: str
    input: Any


class SpanSpec(NamedTuple):
    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    start_time: float
    end_time: float
    attributes: dict[str, Any]


class Adapter:
    """The adapter contract of the workload: one instance per OS process, all workload methods are coroutines."""

    name = "abstract"
    impl = "unknown"
    mode = "inproc"  # or "server"

    def __init__(self, endpoint: str | None = None, workdir: str | None = None) -> None:
        self.endpoint = endpoint
        self.workdir = workdir or tempfile.mkdtemp(prefix="bench-")

    @classmethod
    def launch_server(cls, host: str, port: int, workdir: str, log_file: Any) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    @classmethod
    def health_url(cls, endpoint: str) -> str:
        raise NotImplementedError

    def impl_version(self) -> str:
        from importlib.metadata import version

        try:
            return version(self.impl)
        except Exception:
            return "unknown"

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def enqueue(self, task: dict[str, Any]) -> str: ...
    async def enqueue_many(self, tasks: list[dict[str, Any]]) -> list[str]: ...
    async def dequeue(self, worker_id: str) -> Claim | None: ...
    async def start_attempt(self, claim: Claim, worker_id: str) -> None: ...
    async def add_span(self, claim: Claim, seq: int, span: SpanSpec) -> bool: ...
    async def add_spans_and_reward(self, claim: Claim, spans: list[SpanSpec], value: float) -> None: ...
    async def add_reward(self, claim: Claim, seq: int, value: float) -> None: ...
    async def finish(self, claim: Claim) -> None: ...
    async def query_spans(self, rollout_id: str) -> list[dict[str, Any]]: ...
    async def rollout_states(self, rollout_ids: list[str]) -> dict[str, tuple[str, int]]: ...


class _Agentbolt(Adapter):
    impl = "agentbolt"
    store_url = "memory://"

    async def open(self) -> None:
        from agentbolt import semconv
        from agentbolt.types import AttemptStatus, Span

        self._Span, self._status, self._sc = Span, AttemptStatus, semconv
        self.store = await self._open_store()

    async def _open_store(self) -> Any:
        from agentbolt.store import build_store

        url = self.store_url.replace("{dir}", self.workdir)
        return build_store(url)

    async def close(self) -> None:
        await self.store.close()

    async def enqueue(self, task: dict[str, Any]) -> str:
        return (await self.store.enqueue_rollout(task)).rollout_id

    async def enqueue_many(self, tasks: list[dict[str, Any]]) -> list[str]:
        from agentbolt.store.base import EnqueueRequest

        return [r.rollout_id for r in await self.store.enqueue_many([EnqueueRequest(input=t) for t in tasks])]

    async def dequeue(self, worker_id: str) -> Claim | None:
        claimed = await self.store.claim_rollout(worker_id)
        if claimed is None:
            return None
        return Claim(claimed.rollout.rollout_id, claimed.attempt.attempt_id, claimed.rollout.input)

    async def start_attempt(self, claim: Claim, worker_id: str) -> None:
        await self.store.update_attempt(claim.rollout_id, claim.attempt_id, self._status.RUNNING)

    def _span(self, claim: Claim, s: SpanSpec) -> Any:
        return self._Span(
            rollout_id=claim.rollout_id,
            attempt_id=claim.attempt_id,
            span_id=s.span_id,
            trace_id=s.trace_id,
            parent_id=s.parent_id,
            name=s.name,
            start_time=s.start_time,
            end_time=s.end_time,
            attributes=s.attributes,
        )

    def _reward_span(self, claim: Claim, value: float) -> Any:
        now = time.time()
        return self._Span(
            rollout_id=claim.rollout_id,
            attempt_id=claim.attempt_id,
            span_id=os.urandom(8).hex(),
            trace_id=os.urandom(16).hex(),
            name=self._sc.SPAN_REWARD,
            start_time=now,
            end_time=now,
            attributes={self._sc.REWARD_VALUE: value},
        )

    async def add_span(self, claim: Claim, seq: int, span: SpanSpec) -> bool:
        await self.store.add_span(self._span(claim, span))
        return True

    async def add_reward(self, claim: Claim, seq: int, value: float) -> None:
        await self.store.add_span(self._reward_span(claim, value))

    async def add_spans_and_reward(self, claim: Claim, spans: list[SpanSpec], value: float) -> None:
        await self.store.add_spans([self._span(claim, s) for s in spans] + [self._reward_span(claim, value)])

    async def finish(self, claim: Claim) -> None:
        await self.store.update_attempt(claim.rollout_id, claim.attempt_id, self._status.SUCCEEDED)

    async def query_spans(self, rollout_id: str) -> list[dict[str, Any]]:
        out = []
        for s in await self.store.query_spans(rollout_id):
            reward = s.attributes.get(self._sc.REWARD_VALUE) if s.name == self._sc.SPAN_REWARD else None
            out.append(
                {
                    "span_id": s.span_id,
                    "seq": s.sequence_id,
                    "name": s.name,
                    "attributes": s.attributes,
                    "reward": reward,
                }
            )
        return out

    async def rollout_states(self, rollout_ids: list[str]) -> dict[str, tuple[str, int]]:
        out: dict[str, tuple[str, int]] = {}
        for at in range(0, len(rollout_ids), 500):
            for r in await self.store.query_rollouts(rollout_ids=rollout_ids[at : at + 500]):
                out[r.rollout_id] = (str(r.status.value), r.num_attempts)
        return out


class AgentboltMemory(_Agentbolt):
    name = "ab-memory"
    store_url = "memory://"


class AgentboltSqlite(_Agentbolt):
    name = "ab-sqlite"
    store_url = "sqlite:///{dir}/bench.db"


class AgentboltSqliteFull(_Agentbolt):
    """SQLite with ``synchronous=full``: an fsync per commit (power-loss durable), for comparison."""

    name = "ab-sqlite-full"
    store_url = "sqlite:///{dir}/bench.db?synchronous=full"


class AgentboltPostgres(_Agentbolt):
    """PostgreSQL, in-process: the server named by ``$AGENTBOLT_BENCH_POSTGRES_URL``, in a fresh schema per run."""

    name = "ab-postgres"

    async def _open_store(self) -> Any:
        import psycopg

        from agentbolt.store import build_store

        url = os.environ.get("AGENTBOLT_BENCH_POSTGRES_URL")
        if not url:
            raise SystemExit("ab-postgres needs AGENTBOLT_BENCH_POSTGRES_URL=postgresql://user@host:port/db")
        schema = f"bench_{os.getpid()}_{int(time.time())}"
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        sep = "&" if "?" in url else "?"
        return build_store(f"{url}{sep}options=-csearch_path%3D{schema}")


class AgentboltHttp(_Agentbolt):
    """``agentbolt serve`` with its default store (a SQLite file), driven through ``HttpLightningStore``."""

    name = "ab-http"
    mode = "server"
    serve_store = "sqlite:///{dir}/served.db"

    @classmethod
    def launch_server(cls, host: str, port: int, workdir: str, log_file: Any) -> subprocess.Popen[bytes]:
        exe = str(Path(sys.executable).with_name("agentbolt"))
        store = cls.serve_store.replace("{dir}", workdir)
        cmd = [exe, "serve", "--store", store, "--create", "--host", host, "--port", str(port)]
        return subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)

    @classmethod
    def health_url(cls, endpoint: str) -> str:
        return endpoint + "/v1/health"

    async def _open_store(self) -> Any:
        from agentbolt.client import HttpLightningStore

        assert self.endpoint is not None
        return HttpLightningStore(self.endpoint)


class AgentboltHttpMemory(AgentboltHttp):
    """``agentbolt serve --store memory://``: the server without durability (for comparison only)."""

    name = "ab-http-memory"
    serve_store = "memory://"


class _Agl(Adapter):
    """agent-lightning 0.3.0, mapped the way its own runner uses the store (spans carry the client's sequence id)."""

    impl = "agentlightning"

    async def open(self) -> None:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        from agentlightning.emitter.reward import emit_reward, get_reward_value
        from agentlightning.types import Span

        self._Span, self._emit_reward, self._reward_of = Span, emit_reward, get_reward_value
        self.store = await self._open_store()

    async def _open_store(self) -> Any:
        raise NotImplementedError

    async def enqueue(self, task: dict[str, Any]) -> str:
        return (await self.store.enqueue_rollout(input=task)).rollout_id

    async def enqueue_many(self, tasks: list[dict[str, Any]]) -> list[str]:
        from agentlightning.types import EnqueueRolloutRequest

        rollouts = await self.store.enqueue_many_rollouts([EnqueueRolloutRequest(input=t) for t in tasks])
        return [r.rollout_id for r in rollouts]

    async def dequeue(self, worker_id: str) -> Claim | None:
        r = await self.store.dequeue_rollout(worker_id=worker_id)
        return None if r is None else Claim(r.rollout_id, r.attempt.attempt_id, r.input)

    async def start_attempt(self, claim: Claim, worker_id: str) -> None:
        await self.store.update_attempt(claim.rollout_id, claim.attempt_id, status="running", worker_id=worker_id)

    def _span(self, claim: Claim, seq: int, s: SpanSpec) -> Any:
        return self._Span.from_attributes(
            attributes=s.attributes,
            rollout_id=claim.rollout_id,
            attempt_id=claim.attempt_id,
            sequence_id=seq,
            name=s.name,
            trace_id=s.trace_id,
            span_id=s.span_id,
            parent_id=s.parent_id,
            start_time=s.start_time,
            end_time=s.end_time,
        )

    def _reward(self, claim: Claim, seq: int, value: float) -> Any:
        core = self._emit_reward(value, propagate=False)
        return self._Span.from_core_fields(
            core, rollout_id=claim.rollout_id, attempt_id=claim.attempt_id, sequence_id=seq
        )

    async def add_span(self, claim: Claim, seq: int, span: SpanSpec) -> bool:
        return (await self.store.add_span(self._span(claim, seq, span))) is not None

    async def add_reward(self, claim: Claim, seq: int, value: float) -> None:
        await self.store.add_span(self._reward(claim, seq, value))

    async def add_spans_and_reward(self, claim: Claim, spans: list[SpanSpec], value: float) -> None:
        batch = [self._span(claim, j + 1, s) for j, s in enumerate(spans)] + [
            self._reward(claim, len(spans) + 1, value)
        ]
        await self.store.add_many_spans(batch)

    async def finish(self, claim: Claim) -> None:
        await self.store.update_attempt(claim.rollout_id, claim.attempt_id, status="succeeded")

    async def query_spans(self, rollout_id: str) -> list[dict[str, Any]]:
        return [
            {
                "span_id": s.span_id,
                "seq": s.sequence_id,
                "name": s.name,
                "attributes": s.attributes,
                "reward": self._reward_of(s),
            }
            for s in await self.store.query_spans(rollout_id)
        ]

    async def rollout_states(self, rollout_ids: list[str]) -> dict[str, tuple[str, int]]:
        out: dict[str, tuple[str, int]] = {}
        for at in range(0, len(rollout_ids), 2000):
            for r in await self.store.query_rollouts(rollout_id_in=rollout_ids[at : at + 2000]):
                attempt = getattr(r, "attempt", None)
                out[r.rollout_id] = (str(r.status), attempt.sequence_id if attempt is not None else 0)
        return out


class AglInProc(_Agl):
    name = "agl-inproc"

    async def _open_store(self) -> Any:
        from agentlightning.store.memory import InMemoryLightningStore

        return InMemoryLightningStore()


class AglHttp(_Agl):
    """``agl store`` (in-memory store behind its HTTP server) driven through ``LightningStoreClient``."""

    name = "agl-http"
    mode = "server"

    @classmethod
    def launch_server(cls, host: str, port: int, workdir: str, log_file: Any) -> subprocess.Popen[bytes]:
        env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
        exe = str(Path(sys.executable).with_name("agl"))
        cmd = [exe, "store", "--host", host, "--port", str(port)]
        return subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    @classmethod
    def health_url(cls, endpoint: str) -> str:
        return endpoint + "/v1/agl/health"

    async def _open_store(self) -> Any:
        from agentlightning.store.client_server import LightningStoreClient

        assert self.endpoint is not None
        return LightningStoreClient(self.endpoint)

    async def close(self) -> None:
        await self.store.close()


ADAPTERS: dict[str, type[Adapter]] = {
    a.name: a
    for a in (
        AgentboltMemory,
        AgentboltSqlite,
        AgentboltSqliteFull,
        AgentboltPostgres,
        AgentboltHttp,
        AgentboltHttpMemory,
        AglInProc,
        AglHttp,
    )
}
