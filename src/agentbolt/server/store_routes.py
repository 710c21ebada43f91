"""The store API under ``/v1``: a thin HTTP skin over any :class:`~agentbolt.store.base.LightningStore`."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request

from agentbolt.store.base import EnqueueRequest, LightningStore
from agentbolt.types import (
    Attempt,
    AttemptedRollout,
    Metric,
    ResourcesUpdate,
    Rollout,
    RolloutMode,
    RolloutStatus,
    Span,
    Worker,
)
from agentbolt.types.api import (
    AttemptStatusBody,
    ClaimBody,
    EnqueueBody,
    EnqueueManyBody,
    HeartbeatBody,
    MetricsBody,
    ResourcesBody,
    SpansBody,
    WaitBody,
)

router = APIRouter(prefix="/v1")


def _store(request: Request) -> LightningStore:
    return request.app.state.store


@router.get("/health")
async def health() -> dict[str, str]:
    """Liveness probe."""
    return {"status": "ok"}


@router.post("/rollouts", response_model=Rollout)
async def enqueue_rollout(body: EnqueueBody, request: Request) -> Rollout:
    return await _store(request).enqueue_rollout(
        body.input, mode=body.mode, resources_id=body.resources_id, config=body.config, metadata=body.metadata
    )


@router.post("/rollouts/batch", response_model=list[Rollout])
async def enqueue_many(body: EnqueueManyBody, request: Request) -> list[Rollout]:
    reqs = [EnqueueRequest(**r.model_dump()) for r in body.requests]
    return await _store(request).enqueue_many(reqs)


@router.post("/rollouts/wait", response_model=list[Rollout])
async def wait_for_rollouts(body: WaitBody, request: Request) -> list[Rollout]:
    return await _store(request).wait_for_rollouts(body.rollout_ids, timeout_s=body.timeout_s)


@router.get("/rollouts", response_model=list[Rollout])
async def query_rollouts(
    request: Request,
    status: list[RolloutStatus] | None = Query(default=None),
    mode: RolloutMode | None = None,
    rollout_id: list[str] | None = Query(default=None),
    limit: int | None = Query(default=None, ge=0, le=10_000),
    offset: int = Query(default=0, ge=0),
) -> list[Rollout]:
    return await _store(request).query_rollouts(
        status=status, mode=mode, rollout_ids=rollout_id, limit=limit, offset=offset
    )


@router.get("/rollouts/{rollout_id}", response_model=Rollout)
async def get_rollout(rollout_id: str, request: Request) -> Rollout:
    return await _store(request).get_rollout(rollout_id)


@router.post("/rollouts/{rollout_id}/cancel", response_model=Rollout)
async def cancel_rollout(rollout_id: str, request: Request) -> Rollout:
    return await _store(request).cancel_rollout(rollout_id)


@router.post("/claims", response_model=AttemptedRollout | None)
async def claim_rollout(body: ClaimBody, request: Request) -> AttemptedRollout | None:
    return await _store(request).claim_rollout(body.worker_id)


@router.get("/rollouts/{rollout_id}/attempts", response_model=list[Attempt])
async def query_attempts(rollout_id: str, request: Request) -> list[Attempt]:
    return await _store(request).query_attempts(rollout_id)


@router.get("/rollouts/{rollout_id}/attempts/{attempt_id}", response_model=Attempt)
async def get_attempt(rollout_id: str, attempt_id: str, request: Request) -> Attempt:
    return await _store(request).get_attempt(rollout_id, attempt_id)


@router.post("/rollouts/{rollout_id}/attempts/{attempt_id}/status", response_model=Attempt)
async def update_attempt(rollout_id: str, attempt_id: str, body: AttemptStatusBody, request: Request) -> Attempt:
    return await _store(request).update_attempt(
        rollout_id, attempt_id, body.status, error=body.error, final_reward=body.final_reward
    )


@router.get("/rollouts/{rollout_id}/spans", response_model=list[Span])
async def query_spans(rollout_id: str, request: Request, attempt_id: str | None = None) -> list[Span]:
    return await _store(request).query_spans(rollout_id, attempt_id)


@router.post("/spans", response_model=Span)
async def add_span(span: Span, request: Request) -> Span:
    return await _store(request).add_span(span)


@router.post("/spans/batch", response_model=list[Span])
async def add_spans(body: SpansBody, request: Request) -> list[Span]:
    return await _store(request).add_spans(body.spans)


@router.post("/resources", response_model=ResourcesUpdate)
async def add_resources(body: ResourcesBody, request: Request) -> ResourcesUpdate:
    return await _store(request).add_resources(body.resources, metadata=body.metadata)


@router.get("/resources", response_model=list[ResourcesUpdate])
async def query_resources(request: Request) -> list[ResourcesUpdate]:
    return await _store(request).query_resources()


@router.get("/resources/latest", response_model=ResourcesUpdate | None)
async def latest_resources(request: Request) -> ResourcesUpdate | None:
    return await _store(request).get_resources(None)


@router.get("/resources/{resources_id}", response_model=ResourcesUpdate | None)
async def get_resources(resources_id: str, request: Request) -> ResourcesUpdate | None:
    return await _store(request).get_resources(resources_id)


@router.post("/workers/{worker_id}/heartbeat", response_model=Worker)
async def heartbeat(worker_id: str, body: HeartbeatBody, request: Request) -> Worker:
    return await _store(request).heartbeat(worker_id, rollout_id=body.rollout_id, attempt_id=body.attempt_id)


@router.get("/workers", response_model=list[Worker])
async def query_workers(request: Request) -> list[Worker]:
    return await _store(request).query_workers()


@router.post("/metrics")
async def add_metrics(body: MetricsBody, request: Request) -> dict[str, int]:
    await _store(request).add_metrics(body.metrics)
    return {"added": len(body.metrics)}


@router.get("/metrics", response_model=list[Metric])
async def query_metrics(request: Request, name: str | None = None) -> list[Metric]:
    return await _store(request).query_metrics(name)
