"""Request bodies of the HTTP API (``/v1``), shared by the server and the HTTP client so both agree on the wire."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentbolt.types.bounds import INT64_MAX
from agentbolt.types.core import AttemptStatus, Metric, RolloutConfig, RolloutMode
from agentbolt.types.resources import Resource
from agentbolt.types.rewards import OptionalReward
from agentbolt.types.spans import Span
from agentbolt.types.training import TrainedSample

MAX_CLAIM_BATCH = 10_000
"""Most rollouts one ``POST /v1/claims/batch`` may ask for (as many as one page of ``GET /v1/rollouts``)."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnqueueBody(_Body):
    """``POST /v1/rollouts``: one rollout to enqueue."""

    input: Any
    mode: RolloutMode = RolloutMode.TRAIN
    resources_id: str | None = None
    config: RolloutConfig | None = None
    metadata: dict[str, Any] | None = None


class EnqueueManyBody(_Body):
    """``POST /v1/rollouts/batch``."""

    requests: list[EnqueueBody]


class ClaimBody(_Body):
    """``POST /v1/claims``: lease the next queued rollout to ``worker_id``."""

    worker_id: str = Field(min_length=1)


class ClaimManyBody(_Body):
    """``POST /v1/claims/batch``: lease up to ``n`` queued rollouts to ``worker_id`` (the store checks ``n >= 1``)."""

    worker_id: str = Field(min_length=1)
    n: int = Field(le=MAX_CLAIM_BATCH)


class AttemptStatusBody(_Body):
    """``POST /v1/rollouts/{rollout_id}/attempts/{attempt_id}/status``."""

    status: AttemptStatus
    error: dict[str, Any] | None = None
    final_reward: OptionalReward = None  # the reward rule (agentbolt.types.rewards): "1", NaN... are a 422


class WaitBody(_Body):
    """``POST /v1/rollouts/wait``: long-poll until the rollouts are terminal or ``timeout_s`` passes."""

    rollout_ids: list[str]
    timeout_s: float = Field(default=10.0, ge=0, le=60)


class SpansBody(_Body):
    """``POST /v1/spans/batch``."""

    spans: list[Span]


class ResourcesBody(_Body):
    """``POST /v1/resources``: a new immutable resources version."""

    resources: dict[str, Resource]
    metadata: dict[str, Any] | None = None


class HeartbeatBody(_Body):
    """``POST /v1/workers/{worker_id}/heartbeat``."""

    rollout_id: str | None = None
    attempt_id: str | None = None


class MetricsBody(_Body):
    """``POST /v1/metrics``."""

    metrics: list[Metric]


class TrainedSamplesBody(_Body):
    """``POST /v1/trained-samples``: the samples one training step's update received (replacing any stored for it)."""

    train_step: int = Field(ge=0, le=INT64_MAX)
    samples: list[TrainedSample]


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer: ``{"error": {"type": <exception class>, "message": <what to do>}}``."""

    error: dict[str, str]
