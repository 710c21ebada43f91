"""``HttpLightningStore``: a client of a running ``agentbolt serve`` that satisfies the store contract.

Errors come back as the same exception classes the server raised (by the ``error.type`` field). Only connection
errors are retried, and only for idempotent reads; writes are never retried blindly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter

from agentbolt.errors import ERRORS_BY_NAME, AgentboltError, BackendError
from agentbolt.store.base import EnqueueRequest, StoreCapabilities
from agentbolt.types import (
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    Metric,
    Resource,
    ResourcesUpdate,
    Rollout,
    RolloutConfig,
    RolloutMode,
    RolloutStatus,
    Span,
    Worker,
)

T = TypeVar("T")

_ROLLOUTS = TypeAdapter(list[Rollout])
_SPANS = TypeAdapter(list[Span])
_ATTEMPTS = TypeAdapter(list[Attempt])
_RESOURCES = TypeAdapter(list[ResourcesUpdate])
_WORKERS = TypeAdapter(list[Worker])
_METRICS = TypeAdapter(list[Metric])
_WAIT_CHUNK_S = 10.0


class HttpLightningStore:
    """The store contract over HTTP.

    Args:
        base_url: server root, e.g. ``http://127.0.0.1:8765``.
        token: bearer token, if the server requires one.
        timeout_s: per-request timeout in seconds.
        read_retries: retries of idempotent GETs on connection errors (not on HTTP errors).
    """

    capabilities = StoreCapabilities(durable=True, shared_across_processes=True)

    def __init__(self, base_url: str, *, token: str | None = None, timeout_s: float = 60.0, read_retries: int = 3):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.base_url = base_url.rstrip("/")
        self._client = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout_s)
        self._read_retries = read_retries

    async def _request(self, method: str, path: str, *, json: Any = None, params: Any = None) -> Any:
        attempts = self._read_retries + 1 if method == "GET" else 1
        resp: httpx.Response | None = None
        for i in range(attempts):
            try:
                resp = await self._client.request(method, path, json=json, params=params)
                break
            except httpx.TransportError as exc:
                if i + 1 >= attempts:
                    raise BackendError(f"cannot reach the agentbolt server at {self.base_url}: {exc!r}") from exc
                await asyncio.sleep(0.2 * (i + 1))
        assert resp is not None
        if resp.status_code >= 400:
            try:
                err = resp.json()["error"]
                cls = ERRORS_BY_NAME.get(err.get("type", ""), AgentboltError)
                message = err.get("message", resp.text)
            except Exception:  # not our error shape (e.g. a proxy in between)
                cls, message = AgentboltError, resp.text
            raise cls(f"{message} (HTTP {resp.status_code} from {method} {path})")
        return resp.json()

    @staticmethod
    def _dump(model: BaseModel) -> Any:
        return model.model_dump(mode="json")

    async def enqueue_rollout(
        self,
        input: Any,
        *,
        mode: RolloutMode = RolloutMode.TRAIN,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Rollout:
        body = EnqueueRequest(input=input, mode=mode, resources_id=resources_id, config=config, metadata=metadata)
        return Rollout.model_validate(await self._request("POST", "/v1/rollouts", json=self._dump(body)))

    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> list[Rollout]:
        body = {"requests": [self._dump(r) for r in requests]}
        return _ROLLOUTS.validate_python(await self._request("POST", "/v1/rollouts/batch", json=body))

    async def claim_rollout(self, worker_id: str) -> AttemptedRollout | None:
        data = await self._request("POST", "/v1/claims", json={"worker_id": worker_id})
        return None if data is None else AttemptedRollout.model_validate(data)

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus,
        *,
        error: dict[str, Any] | None = None,
        final_reward: float | None = None,
    ) -> Attempt:
        body = {"status": status.value, "error": error, "final_reward": final_reward}
        path = f"/v1/rollouts/{rollout_id}/attempts/{attempt_id}/status"
        return Attempt.model_validate(await self._request("POST", path, json=body))

    async def cancel_rollout(self, rollout_id: str) -> Rollout:
        return Rollout.model_validate(await self._request("POST", f"/v1/rollouts/{rollout_id}/cancel"))

    async def get_rollout(self, rollout_id: str) -> Rollout:
        return Rollout.model_validate(await self._request("GET", f"/v1/rollouts/{rollout_id}"))

    async def query_rollouts(
        self,
        *,
        status: Sequence[RolloutStatus] | None = None,
        mode: RolloutMode | None = None,
        rollout_ids: Sequence[str] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Rollout]:
        if (status is not None and len(status) == 0) or (rollout_ids is not None and len(rollout_ids) == 0):
            return []  # an empty filter matches nothing; a query string cannot say "empty list"
        params: list[tuple[str, str | int]] = [("offset", offset)]
        params += [("status", s.value) for s in status or ()]
        params += [("rollout_id", r) for r in rollout_ids or ()]
        if mode is not None:
            params.append(("mode", mode.value))
        if limit is not None:
            params.append(("limit", limit))
        return _ROLLOUTS.validate_python(await self._request("GET", "/v1/rollouts", params=params))

    async def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt:
        return Attempt.model_validate(await self._request("GET", f"/v1/rollouts/{rollout_id}/attempts/{attempt_id}"))

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        return _ATTEMPTS.validate_python(await self._request("GET", f"/v1/rollouts/{rollout_id}/attempts"))

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout_s: float | None = None) -> list[Rollout]:
        """Long-polls in chunks of at most 10 s, so any ``timeout_s`` (``None``: no limit) is honoured."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        ids = list(rollout_ids)
        while True:
            left = _WAIT_CHUNK_S if deadline is None else max(0.0, min(_WAIT_CHUNK_S, deadline - time.monotonic()))
            body = {"rollout_ids": ids, "timeout_s": left}
            done = _ROLLOUTS.validate_python(await self._request("POST", "/v1/rollouts/wait", json=body))
            if len(done) == len(ids) or (deadline is not None and time.monotonic() >= deadline):
                return done

    async def add_span(self, span: Span) -> Span:
        return Span.model_validate(await self._request("POST", "/v1/spans", json=self._dump(span)))

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        if not spans:
            return []
        body = {"spans": [self._dump(s) for s in spans]}
        return _SPANS.validate_python(await self._request("POST", "/v1/spans/batch", json=body))

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        params = {"attempt_id": attempt_id} if attempt_id else None
        return _SPANS.validate_python(await self._request("GET", f"/v1/rollouts/{rollout_id}/spans", params=params))

    async def add_resources(
        self, resources: dict[str, Resource], *, metadata: dict[str, Any] | None = None
    ) -> ResourcesUpdate:
        body = {"resources": {k: v.model_dump(mode="json") for k, v in resources.items()}, "metadata": metadata}
        return ResourcesUpdate.model_validate(await self._request("POST", "/v1/resources", json=body))

    async def get_resources(self, resources_id: str | None = None) -> ResourcesUpdate | None:
        path = "/v1/resources/latest" if resources_id is None else f"/v1/resources/{resources_id}"
        data = await self._request("GET", path)
        return None if data is None else ResourcesUpdate.model_validate(data)

    async def query_resources(self) -> list[ResourcesUpdate]:
        return _RESOURCES.validate_python(await self._request("GET", "/v1/resources"))

    async def heartbeat(
        self, worker_id: str, *, rollout_id: str | None = None, attempt_id: str | None = None
    ) -> Worker:
        body = {"rollout_id": rollout_id, "attempt_id": attempt_id}
        return Worker.model_validate(await self._request("POST", f"/v1/workers/{worker_id}/heartbeat", json=body))

    async def query_workers(self) -> list[Worker]:
        return _WORKERS.validate_python(await self._request("GET", "/v1/workers"))

    async def add_metrics(self, metrics: Sequence[Metric]) -> None:
        await self._request("POST", "/v1/metrics", json={"metrics": [self._dump(m) for m in metrics]})

    async def query_metrics(self, name: str | None = None) -> list[Metric]:
        params = {"name": name} if name else None
        return _METRICS.validate_python(await self._request("GET", "/v1/metrics", params=params))

    async def close(self) -> None:
        await self._client.aclose()
