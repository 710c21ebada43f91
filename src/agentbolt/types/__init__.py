"""Pydantic models of agentbolt's vocabulary (DESIGN.md). No I/O happens here."""

from agentbolt.types.core import (
    DEFAULT_UNRESPONSIVE_S,
    TERMINAL_ATTEMPT_STATUSES,
    TERMINAL_ROLLOUT_STATUSES,
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    Metric,
    Rollout,
    RolloutConfig,
    RolloutMode,
    RolloutStatus,
    Worker,
)
from agentbolt.types.resources import LLM, PromptTemplate, Resource, ResourcesUpdate
from agentbolt.types.spans import Span, SpanStatus
from agentbolt.types.training import TrainedCall, TrainedSample, Trajectory, TrajectoryFlag, Transition

__all__ = [
    "DEFAULT_UNRESPONSIVE_S",
    "LLM",
    "TERMINAL_ATTEMPT_STATUSES",
    "TERMINAL_ROLLOUT_STATUSES",
    "Attempt",
    "AttemptStatus",
    "AttemptedRollout",
    "Metric",
    "PromptTemplate",
    "Resource",
    "ResourcesUpdate",
    "Rollout",
    "RolloutConfig",
    "RolloutMode",
    "RolloutStatus",
    "Span",
    "SpanStatus",
    "TrainedCall",
    "TrainedSample",
    "Trajectory",
    "TrajectoryFlag",
    "Transition",
    "Worker",
]
