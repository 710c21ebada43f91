"""Agent-side recording API: ``emit_reward`` (more emitters arrive with the tracing issue).

These functions never block on the network: they build a span and hand it to the attempt's sink.
Outside an attempt they do nothing but log once, so an agent runs unchanged outside a runner.
"""

from __future__ import annotations

import logging
import math

from agentbolt import semconv
from agentbolt.errors import ConfigError
from agentbolt.tracing.context import current_attempt
from agentbolt.types import Span

logger = logging.getLogger(__name__)
_warned_outside = False


def emit_reward(value: float, name: str | None = None) -> Span | None:
    """Record a reward for the current attempt.

    Args:
        value: a finite float (bool and int are accepted and converted).
        name: optional name; the final reward of an attempt is its last unnamed reward, unless the agent returns one.

    Returns:
        The recorded span, or ``None`` when called outside an attempt.

    Raises:
        ConfigError: ``value`` is not a finite number.
    """
    global _warned_outside
    try:
        reward = float(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"emit_reward needs a number, got {value!r} ({type(value).__name__})") from exc
    if not math.isfinite(reward):
        raise ConfigError(f"emit_reward needs a finite number, got {reward}")
    ctx = current_attempt()
    if ctx is None:
        if not _warned_outside:
            logger.warning("emit_reward(%s) called outside a rollout attempt; it is not recorded", reward)
            _warned_outside = True
        return None
    attributes: dict[str, object] = {semconv.REWARD_VALUE: reward}
    if name is not None:
        attributes[semconv.REWARD_NAME] = name
    return ctx.record(semconv.SPAN_REWARD, attributes)
