"""Why a rollout gave nothing to train on: one named cause per rollout (the failure taxonomy). Pure, no I/O.

:func:`failure_cause` looks at a finished rollout, its last attempt and that attempt's spans, and returns the first
cause that applies, in this order:

============================  ==============================================================================
cause                         meaning
============================  ==============================================================================
``never_ran``                 no attempt was ever made (no runner claimed it before the step ended)
``cancelled``                 the rollout was cancelled (by the job at Ctrl-C, or over the API)
``timeout``                   the attempt ran past ``timeout_seconds``; the runner stopped it
``unresponsive``              no heartbeat for ``unresponsive_seconds``: the runner or its process died
``backend_unavailable``       a gateway call failed because no model was serving (503)
``gateway_error``             a gateway call failed on the serving side (upstream 502, internal 500)
``agent_exception``           the agent raised (the detail names the exception type and message)
``bad_reward``                the agent returned something that is not a reward (a string, NaN, an object)
``no_reward``                 the agent returned ``None`` and emitted no final reward
``bad_task``                  the agent could not be started on the task: it asks for a resource its version
                              lacks (a task that is not a JSON object never gets here: the job refuses it
                              before it starts, naming the file and line)
``no_gateway_call``           the agent gave a reward but made no LLM call through its ``llm.endpoint``
``no_trainable_call``         the agent called the gateway, but no call is trainable (every call failed, or the
                              backend returns no token ids)
============================  ==============================================================================

``truncated`` (calls cut at ``max_tokens``) is not a cause of exclusion (such calls are trained, masked or penalized
per ``grpo.truncated``) and is counted separately, per call (:func:`count_truncated`).

The runner names the causes only it can know on the attempt's ``error`` (``error["cause"]``: ``agent_exception``,
``bad_reward``, ``no_reward``, ``timeout``, ``bad_task``); the others are read from the statuses and spans.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from agentbolt import semconv
from agentbolt.adapter.signals import INFRA_ERROR_CODES
from agentbolt.adapter.trajectory import _finish_reason, build_trajectory, last_reward
from agentbolt.types import Attempt, AttemptStatus, Rollout, RolloutStatus, Span

NEVER_RAN: Final = "never_ran"
CANCELLED: Final = "cancelled"
TIMEOUT: Final = "timeout"
UNRESPONSIVE: Final = "unresponsive"
BACKEND_UNAVAILABLE: Final = "backend_unavailable"
GATEWAY_ERROR: Final = "gateway_error"
AGENT_EXCEPTION: Final = "agent_exception"
BAD_REWARD: Final = "bad_reward"
NO_REWARD: Final = "no_reward"
BAD_TASK: Final = "bad_task"
NO_GATEWAY_CALL: Final = "no_gateway_call"
NO_TRAINABLE_CALL: Final = "no_trainable_call"

CAUSES: Final[tuple[str, ...]] = (
    NEVER_RAN,
    CANCELLED,
    TIMEOUT,
    UNRESPONSIVE,
    BACKEND_UNAVAILABLE,
    GATEWAY_ERROR,
    AGENT_EXCEPTION,
    BAD_REWARD,
    NO_REWARD,
    BAD_TASK,
    NO_GATEWAY_CALL,
    NO_TRAINABLE_CALL,
)
"""Every cause, in the order :func:`failure_cause` checks them."""

RUNNER_CAUSES: Final = frozenset({AGENT_EXCEPTION, BAD_REWARD, NO_REWARD, TIMEOUT, BAD_TASK})
"""Causes a runner writes on the attempt's ``error["cause"]``."""

INFRA_CAUSES: Final = frozenset({TIMEOUT, UNRESPONSIVE, BACKEND_UNAVAILABLE, GATEWAY_ERROR})
"""Causes that say nothing about the policy (the rollout is never scored 0 for them)."""

HINTS: Final[dict[str, str]] = {
    NEVER_RAN: "no runner took the rollout: check that runners are up (agentbolt run, or the job's runner_processes)",
    CANCELLED: "the rollout was cancelled",
    TIMEOUT: "the agent ran past grpo.rollout_timeout_s: look for a hung tool or LLM call, or raise the limit",
    UNRESPONSIVE: "the runner stopped sending heartbeats: its process died (out of memory? killed?)",
    BACKEND_UNAVAILABLE: "no model was serving the gateway's calls",
    GATEWAY_ERROR: "the gateway's backend failed; see the server's log",
    AGENT_EXCEPTION: "the agent raised: fix the error shown, try it with agentbolt.trace_attempt",
    BAD_REWARD: "return a number or a bool; convert text where its meaning is known (float(text))",
    NO_REWARD: "return a number (the reward), or call agentbolt.emit_reward(value) before returning",
    BAD_TASK: "the agent's parameters must be the task, then resources by name (llm, ...), rollout or resources",
    NO_GATEWAY_CALL: "point the agent's client at llm.endpoint (base_url=llm.endpoint), not at the server root",
    NO_TRAINABLE_CALL: "every LLM call failed or returned no token ids; see the spans of a rollout",
}
"""What to do about each cause, one line each (terminal summary, dashboard)."""


@dataclass(frozen=True)
class FailureCause:
    """One rollout's cause (a name in :data:`CAUSES`) and a one-line detail (e.g. ``ValueError: bad input``)."""

    cause: str
    detail: str = ""


def _gateway_failure(spans: Sequence[Span]) -> FailureCause | None:
    for span in sorted(spans, key=lambda s: s.sequence_id):
        if span.name != semconv.SPAN_LLM_CALL:
            continue
        code = span.attributes.get(semconv.LLM_ERROR_CODE)
        if code in INFRA_ERROR_CODES:
            message = str(span.attributes.get(semconv.LLM_ERROR, ""))[:300]
            cause = BACKEND_UNAVAILABLE if code == "backend_unavailable" else GATEWAY_ERROR
            return FailureCause(cause, f"{code}: {message}" if message else str(code))
    return None


def _from_error(error: dict[str, object] | None) -> FailureCause:
    """The cause a runner wrote on a failed attempt (``error["cause"]``); an error without one is an exception."""
    error = error or {}
    cause = error.get("cause")
    kind, message = str(error.get("type", "")), str(error.get("message", ""))[:300]
    if kind == CANCELLED:
        return FailureCause(CANCELLED, message)
    if isinstance(cause, str) and cause in CAUSES:
        if cause == AGENT_EXCEPTION:
            return FailureCause(cause, f"{error.get('exception_type', kind)}: {message}")
        return FailureCause(cause, message)
    return FailureCause(AGENT_EXCEPTION, f"{kind}: {message}" if kind else message)


def failure_cause(
    rollout: Rollout, attempt: Attempt | None, spans: Sequence[Span], *, trainable: bool | None = None
) -> FailureCause | None:
    """The cause of a rollout that gave nothing to train on, or ``None`` when nothing stood in the way.

    Args:
        rollout: the finished rollout.
        attempt: its last attempt (``None``: it never ran).
        spans: that attempt's spans.
        trainable: whether its trajectory has a trainable call (``None``: the adapter's own rule,
            :func:`agentbolt.adapter.build_trajectory`'s ``trainable``).

    Returns:
        The first cause that applies, in the order of :data:`CAUSES` (module docstring).
    """
    if rollout.status is RolloutStatus.CANCELLED:
        return FailureCause(CANCELLED, "the rollout was cancelled")
    if attempt is None:
        return FailureCause(NEVER_RAN, "no attempt was made")
    if attempt.status is AttemptStatus.TIMEOUT:
        return FailureCause(TIMEOUT, str((attempt.error or {}).get("message", "")))
    if attempt.status is AttemptStatus.UNRESPONSIVE:
        return FailureCause(UNRESPONSIVE, str((attempt.error or {}).get("message", "")))
    infra = _gateway_failure(spans)
    if infra is not None:
        return infra
    if rollout.status is not RolloutStatus.SUCCEEDED:
        return _from_error(attempt.error)
    if rollout.final_reward is None and last_reward(spans) is None:
        return FailureCause(NO_REWARD, "the agent returned None and emitted no final reward")
    calls = [s for s in spans if s.name == semconv.SPAN_LLM_CALL]
    if not calls:
        endpoint = f"/v1/rollouts/{rollout.rollout_id}/attempts/{attempt.attempt_id}/v1"
        return FailureCause(NO_GATEWAY_CALL, f"no LLM call reached its llm.endpoint (<server>{endpoint})")
    if trainable is None:
        trainable = build_trajectory(rollout, attempt.attempt_id, spans).trainable
    if not trainable:
        return FailureCause(NO_TRAINABLE_CALL, f"{len(calls)} LLM calls recorded, none trainable")
    return None


def count_truncated(spans: Sequence[Span]) -> tuple[int, int]:
    """``(calls cut at max_tokens, LLM calls)`` among an attempt's OK LLM spans (finish reason ``length``)."""
    calls = [s for s in spans if s.name == semconv.SPAN_LLM_CALL and s.status.code != "ERROR"]
    cut = sum(1 for s in calls if _finish_reason(s.attributes.get(semconv.GEN_AI_RESPONSE_FINISH_REASON)) == "length")
    return cut, len(calls)
