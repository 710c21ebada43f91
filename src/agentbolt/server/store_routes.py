"""The store API under ``/v1``: a thin HTTP skin over any :class:`~agentbolt.store.base.LightningStore`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request, Response
from pydantic import TypeAdapter

from agentbolt.server.errors import error_responses
from agentbolt.store import rules
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
    TrainedSample,
    Worker,
)
from agentbolt.types.api import (
    AttemptStatusBody,
    ClaimBody,
    ClaimManyBody,
    EnqueueBody,
    EnqueueManyBody,
    HeartbeatBody,
    MetricsBody,
    ResourcesBody,
    SpansBody,
    TrainedSamplesBody,
    WaitBody,
)
from agentbolt.types.bounds import INT64_MAX

router = APIRouter(prefix="/v1")

_NOT_FOUND = error_responses(404)
_NOT_FOUND_OR_CONFLICT = error_responses(404, 409)
"""The route-specific error answers (every route's own are declared app-wide: 401, 400/413/422)."""

_SORT_HELP = (
    f"one of {', '.join(rules.ROLLOUT_SORT_FIELDS)}; missing values last, ties in enqueue order "
    "(reversed when descending)"
)


def _store(request: Request) -> LightningStore:
    return request.app.state.store


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def _reply(value: Any, kind: Any) -> Response:
    """Answer ``value`` as JSON encoded by pydantic's serializer for ``kind`` (the route's ``response_model``).

    Returning a ready :class:`Response` skips FastAPI's second validation and dict-then-JSON encoding of the answer,
    which cost more than the store call itself on the hot routes (span ingestion, claims).
    """
    adapter = _ADAPTERS.get(kind)
    if adapter is None:
        adapter = _ADAPTERS.setdefault(kind, TypeAdapter(kind))
    return Response(adapter.dump_json(value), media_type="application/json")


# The hot routes (one call per span, claim and status change) come first: FastAPI tries routes in order.
@router.post("/spans", response_model=Span, responses=_NOT_FOUND_OR_CONFLICT)
async def add_span(span: Span, request: Request) -> Response:
    """Store one span with the next ``sequence_id`` of its attempt (a heartbeat too); 404 for an unknown attempt.

    A reward span (``agentbolt.reward``) whose value is not a finite number or a bool (``"1"``, ``null``, NaN) is a
    422 naming the span and the value; a reward span for an attempt that has ended is a 409 (rules:
    :mod:`agentbolt.store.rules`)."""
    return _reply(await _store(request).add_span(span), Span)


@router.post("/claims", response_model=AttemptedRollout | None)
async def claim_rollout(body: ClaimBody, request: Request) -> Response:
    """Lease the oldest queued rollout to ``worker_id`` with a new attempt; ``null`` when the queue is empty."""
    return _reply(await _store(request).claim_rollout(body.worker_id), AttemptedRollout | None)


@router.post(
    "/rollouts/{rollout_id}/attempts/{attempt_id}/status", response_model=Attempt, responses=_NOT_FOUND_OR_CONFLICT
)
async def update_attempt(rollout_id: str, attempt_id: str, body: AttemptStatusBody, request: Request) -> Response:
    """Move an attempt to ``status`` (and its rollout along); 404 if unknown, 409 for an illegal transition, 422 for
    a ``final_reward`` that is not a finite number or a bool (``"1"``, NaN: the one reward rule)."""
    return _reply(
        await _store(request).update_attempt(
            rollout_id, attempt_id, body.status, error=body.error, final_reward=body.final_reward
        ),
        Attempt,
    )


@router.post("/rollouts", response_model=Rollout, responses=_NOT_FOUND)
async def enqueue_rollout(body: EnqueueBody, request: Request) -> Response:
    """Enqueue one rollout in state ``queuing``; 404 for an unknown ``resources_id``."""
    return _reply(
        await _store(request).enqueue_rollout(
            body.input, mode=body.mode, resources_id=body.resources_id, config=body.config, metadata=body.metadata
        ),
        Rollout,
    )


@router.get("/rollouts/{rollout_id}/spans", response_model=list[Span], responses=_NOT_FOUND)
async def query_spans(rollout_id: str, request: Request, attempt_id: str | None = None) -> Response:
    """Spans of one attempt (default: the rollout's latest), by ``sequence_id``; 404 if unknown."""
    return _reply(await _store(request).query_spans(rollout_id, attempt_id), list[Span])


@router.post("/spans/batch", response_model=list[Span], responses=_NOT_FOUND_OR_CONFLICT)
async def add_spans(body: SpansBody, request: Request) -> Response:
    """Store spans all or nothing, in order; 404 for an unknown attempt, 422 for a reward span whose value is not a
    reward, 409 for a reward span of an ended attempt (then nothing is stored)."""
    return _reply(await _store(request).add_spans(body.spans), list[Span])


@router.post("/claims/batch", response_model=list[AttemptedRollout])
async def claim_many(body: ClaimManyBody, request: Request) -> Response:
    """Lease up to ``n`` of the oldest queued rollouts to one worker (``n < 1`` is a 422)."""
    return _reply(await _store(request).claim_many(body.worker_id, body.n), list[AttemptedRollout])


@router.post("/rollouts/batch", response_model=list[Rollout], responses=_NOT_FOUND)
async def enqueue_many(body: EnqueueManyBody, request: Request) -> Response:
    """Enqueue several rollouts, all or nothing, in order; 404 for an unknown ``resources_id``."""
    reqs = [EnqueueRequest(**r.model_dump()) for r in body.requests]
    return _reply(await _store(request).enqueue_many(reqs), list[Rollout])


@router.post("/workers/{worker_id}/heartbeat", response_model=Worker, responses=_NOT_FOUND)
async def heartbeat(worker_id: str, body: HeartbeatBody, request: Request) -> Response:
    """Register or refresh a worker; with an attempt, refresh that attempt's heartbeat too (404 if unknown)."""
    return _reply(
        await _store(request).heartbeat(worker_id, rollout_id=body.rollout_id, attempt_id=body.attempt_id), Worker
    )


@router.get("/health")
async def health() -> dict[str, str]:
    """Liveness probe."""
    return {"status": "ok"}


@router.post("/rollouts/wait", response_model=list[Rollout], responses=_NOT_FOUND)
async def wait_for_rollouts(body: WaitBody, request: Request) -> Response:
    """Long-poll until every listed rollout is terminal or ``timeout_s`` passes.

    Returns the rollouts that are terminal by then, in the order asked; 404 for an unknown id.
    """
    return _reply(await _store(request).wait_for_rollouts(body.rollout_ids, timeout_s=body.timeout_s), list[Rollout])


@router.get("/rollouts", response_model=list[Rollout])
async def query_rollouts(
    request: Request,
    status: list[RolloutStatus] | None = Query(default=None),
    mode: RolloutMode | None = None,
    rollout_id: list[str] | None = Query(default=None),
    limit: int | None = Query(default=None, ge=0, le=10_000),
    offset: int = Query(default=0, ge=0, le=INT64_MAX),
    sort_by: str = Query(default=rules.DEFAULT_ROLLOUT_SORT, description=_SORT_HELP),
    descending: bool = False,
) -> Response:
    """Rollouts matching every filter, sorted by ``sort_by`` (an unknown field is a 422 naming the allowed ones)."""
    return _reply(
        await _store(request).query_rollouts(
            status=status,
            mode=mode,
            rollout_ids=rollout_id,
            limit=limit,
            offset=offset,
            sort_by=sort_by,
            descending=descending,
        ),
        list[Rollout],
    )


@router.get("/rollouts/{rollout_id}", response_model=Rollout, responses=_NOT_FOUND)
async def get_rollout(rollout_id: str, request: Request) -> Response:
    """One rollout; 404 if unknown."""
    return _reply(await _store(request).get_rollout(rollout_id), Rollout)


@router.post("/rollouts/{rollout_id}/cancel", response_model=Rollout, responses=_NOT_FOUND_OR_CONFLICT)
async def cancel_rollout(rollout_id: str, request: Request) -> Response:
    """Cancel a rollout that is not terminal yet; 404 if unknown, 409 if already terminal."""
    return _reply(await _store(request).cancel_rollout(rollout_id), Rollout)


@router.get("/rollouts/{rollout_id}/attempts", response_model=list[Attempt], responses=_NOT_FOUND)
async def query_attempts(rollout_id: str, request: Request) -> Response:
    """Every attempt of a rollout, by ``sequence_id``; 404 for an unknown rollout."""
    return _reply(await _store(request).query_attempts(rollout_id), list[Attempt])


@router.get("/rollouts/{rollout_id}/attempts/{attempt_id}", response_model=Attempt, responses=_NOT_FOUND)
async def get_attempt(rollout_id: str, attempt_id: str, request: Request) -> Response:
    """One attempt; 404 if the rollout or the attempt is unknown."""
    return _reply(await _store(request).get_attempt(rollout_id, attempt_id), Attempt)


@router.post("/resources", response_model=ResourcesUpdate)
async def add_resources(body: ResourcesBody, request: Request) -> Response:
    """Store a new immutable resources version and make it the latest."""
    return _reply(await _store(request).add_resources(body.resources, metadata=body.metadata), ResourcesUpdate)


@router.get("/resources", response_model=list[ResourcesUpdate])
async def query_resources(request: Request) -> Response:
    """Every resources version, oldest first."""
    return _reply(await _store(request).query_resources(), list[ResourcesUpdate])


@router.get("/resources/latest", response_model=ResourcesUpdate | None)
async def latest_resources(request: Request) -> Response:
    """The latest resources version, or ``null`` before the first one is written."""
    return _reply(await _store(request).get_resources(None), ResourcesUpdate | None)


@router.get("/resources/{resources_id}", response_model=ResourcesUpdate | None, responses=_NOT_FOUND)
async def get_resources(resources_id: str, request: Request) -> Response:
    """One resources version; 404 if unknown."""
    return _reply(await _store(request).get_resources(resources_id), ResourcesUpdate | None)


@router.get("/workers", response_model=list[Worker])
async def query_workers(request: Request) -> Response:
    """Every known worker."""
    return _reply(await _store(request).query_workers(), list[Worker])


@router.post("/metrics")
async def add_metrics(body: MetricsBody, request: Request) -> dict[str, int]:
    """Append training-curve points; answers how many were added."""
    await _store(request).add_metrics(body.metrics)
    return {"added": len(body.metrics)}


@router.get("/metrics", response_model=list[Metric])
async def query_metrics(request: Request, name: str | None = None) -> Response:
    """Points of one curve (``name``) or of all, by ``train_step`` then insertion."""
    return _reply(await _store(request).query_metrics(name), list[Metric])


@router.post("/trained-samples", responses=_NOT_FOUND)
async def put_trained_samples(body: TrainedSamplesBody, request: Request) -> dict[str, int]:
    """Record the samples one training step's update received, replacing what was recorded for that step (all or
    nothing); answers how many were stored. 404 when a sample names an unknown attempt, 422 for a sample of another
    step or a repeated ``sample_index``."""
    await _store(request).put_trained_samples(body.train_step, body.samples)
    return {"stored": len(body.samples)}


@router.get("/trained-samples", response_model=list[TrainedSample])
async def query_trained_samples(
    request: Request, rollout_id: str | None = None, train_step: int | None = Query(default=None, ge=0, le=INT64_MAX)
) -> Response:
    """The recorded trained samples of one rollout and/or one step (or all), by ``train_step`` then
    ``sample_index``; ``[]`` when none match."""
    return _reply(
        await _store(request).query_trained_samples(rollout_id=rollout_id, train_step=train_step), list[TrainedSample]
    )
