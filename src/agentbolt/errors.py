"""agentbolt's exceptions. Each maps to one HTTP status, so the server and the HTTP client agree.

    AgentboltError                 500 (a bug if it reaches a user)
     ├── NotFoundError             404  (also a LookupError)
     ├── ConflictError             409
     │    └── InvalidTransitionError 409  names the allowed transitions
     ├── ConfigError               422  (also a ValueError)
     │    └── RewardError          422  a value that is not a reward (names the value and where it came from)
     └── BackendError              503  inference or external backend unavailable

To add one: subclass the closest class, set ``http_status``, keep ``__init__(message)`` so it stays picklable.
"""

from __future__ import annotations


class AgentboltError(Exception):
    """Base class of every error agentbolt raises on purpose."""

    http_status: int = 500


class NotFoundError(AgentboltError, LookupError):
    """An id (rollout, attempt, resources, worker) does not exist."""

    http_status = 404


class ConflictError(AgentboltError):
    """The request is valid but conflicts with current state (e.g. a call for a terminal attempt)."""

    http_status = 409


class InvalidTransitionError(ConflictError):
    """An illegal status transition. The message names the current state and the allowed targets."""


class ConfigError(AgentboltError, ValueError):
    """Bad configuration or bad input values. The message says what to change."""

    http_status = 422


class RewardError(ConfigError):
    """A value given as a reward that is not one (a string, None, NaN, inf, a list...). The message names the value,
    its type, where it came from and what to pass instead (the rule: :mod:`agentbolt.types.rewards`)."""


class BackendError(AgentboltError):
    """An inference backend or other dependency failed or is missing."""

    http_status = 503


ERRORS_BY_NAME: dict[str, type[AgentboltError]] = {
    cls.__name__: cls
    for cls in (
        AgentboltError,
        NotFoundError,
        ConflictError,
        InvalidTransitionError,
        ConfigError,
        RewardError,
        BackendError,
    )
}
ERRORS_BY_NAME["ValidationError"] = ConfigError  # the server's request-validation answers (422)
