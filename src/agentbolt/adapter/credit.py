"""Credit assignment: a rollout's outcome -> one reward per transition (DESIGN.md, LightningRL step 2).

Two layers. The math is pure functions on plain numbers (:func:`broadcast`, :func:`discounted_rewards`,
:func:`air_reward`). A *scheme* (:class:`CreditScheme`) applies them to a :class:`~agentbolt.types.Trajectory` and
returns ``rewards_T``, one reward per transition in trajectory order; it reads the trajectory and never changes it
(writing the rewards onto transitions is the caller's thin step).

Schemes (registered in ``CREDIT_ASSIGNMENT`` under the names in brackets, with default parameters):

- ``broadcast`` [``broadcast``]: every transition gets the final reward ``R``. LightningRL's default (Luo et al.,
  "Agent Lightning: Train ANY AI Agents with Reinforcement Learning", arXiv:2508.03680, 2025, section 3): each LLM
  call of a rollout is credited with the rollout's outcome, so a single-turn objective applies per call.
- ``discounted(gamma)`` [``discounted``, gamma = :data:`DEFAULT_GAMMA`]: turn ``t`` of ``T`` gets
  ``gamma ** (T - 1 - t) * R``. This is the discounted return ``G_t = sum_k gamma^k r_{t+k}`` (Sutton & Barto,
  "Reinforcement Learning: An Introduction", 2nd ed. 2018, eq. 3.8) of an episode whose only reward is ``R`` after
  its last turn, so the last call gets ``R`` and earlier calls less: a late call is credited more for the outcome.
- ``intermediate(weights, base)`` [``intermediate``, default :class:`AIRWeights` over ``broadcast``]: automatic
  intermediate rewards (AIR: Luo et al. 2025's "Automatic Intermediate Rewarding", which turns system monitoring
  signals such as a tool call's return status into intermediate rewards): ``base(trajectory)[t] +
  air_reward(signals_t, weights)``, where ``signals_t`` are the signals the trace already has about transition
  ``t``, read from ``transition.metadata`` (keys below). The weights are ours to choose (:class:`AIRWeights`).
- ``from_function(fn)``: any user function ``(trajectory) -> rewards_T``; registered by name with
  :func:`register_credit_assignment`, or passed directly.

Every scheme's output is checked (one finite reward per transition) and a violation raises :class:`ConfigError`.

AIR metadata keys (set by the adapter on ``Transition.metadata``; a missing key means "no such signal"). The
signals of a transition are those caused by its response: spans that ended after its LLM call ended and before the
next transition's call started (store ``sequence_id`` order); those after the last call go to the last call.

- :data:`AIR_TOOL_CALLS_OK` (``"air.tool_calls_ok"``, int >= 0): tool calls that returned without error.
- :data:`AIR_TOOL_CALLS_FAILED` (``"air.tool_calls_failed"``, int >= 0): tool calls whose span has status ERROR.
- :data:`AIR_EXCEPTIONS` (``"air.exceptions"``, int >= 0): exception spans/events recorded by the agent
  (``agentbolt.exception``, or OTel ``exception`` events) outside tool spans.
- :data:`AIR_FORMAT_VALID` (``"air.format_valid"``, bool): the response parsed as the agent expected (e.g. its
  tool-call arguments are valid JSON for the declared schema); missing = not checked.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Final, Protocol, overload

from agentbolt.errors import ConfigError
from agentbolt.registry import Registry
from agentbolt.types import Trajectory
from agentbolt.types.training import AIR_EXCEPTIONS, AIR_FORMAT_VALID, AIR_TOOL_CALLS_FAILED, AIR_TOOL_CALLS_OK

DEFAULT_GAMMA: Final = 0.9
"""The discount of the registered ``discounted`` scheme (our choice; build another with :func:`discounted`)."""


# ---- pure math on plain numbers ----------------------------------------------------------------------------------


def _check_outcome(final_reward: float, n_transitions: int) -> None:
    if not math.isfinite(final_reward):
        raise ConfigError(f"final_reward must be a finite number, got {final_reward}")
    if n_transitions < 0:
        raise ConfigError(f"n_transitions must be >= 0, got {n_transitions}")


def broadcast(final_reward: float, n_transitions: int) -> list[float]:
    """Give every transition the rollout's final reward (LightningRL's default, arXiv:2508.03680).

    Args:
        final_reward: the rollout's outcome reward (finite).
        n_transitions: T, the number of transitions of the trajectory (>= 0).

    Returns:
        ``rewards_T``: ``[final_reward] * T`` (empty when T is 0).

    Raises:
        ConfigError: ``final_reward`` is not finite or ``n_transitions`` is negative.
    """
    _check_outcome(final_reward, n_transitions)
    return [float(final_reward)] * n_transitions


def discounted_rewards(final_reward: float, n_transitions: int, gamma: float) -> list[float]:
    """``rewards_T[t] = gamma ** (T - 1 - t) * final_reward``: the discounted return of each turn when the only
    reward is the outcome after the last turn (Sutton & Barto 2018, eq. 3.8).

    Args:
        final_reward: the rollout's outcome reward R (finite).
        n_transitions: T (>= 0).
        gamma: the per-turn discount in ``(0, 1]``; 1 is :func:`broadcast`.

    Returns:
        ``rewards_T``; the last entry is ``final_reward``.

    Raises:
        ConfigError: ``final_reward`` not finite, ``n_transitions < 0`` or ``gamma`` outside ``(0, 1]``.
    """
    _check_outcome(final_reward, n_transitions)
    _check_gamma(gamma)
    return [float(final_reward) * gamma ** (n_transitions - 1 - t) for t in range(n_transitions)]


def _check_gamma(gamma: float) -> None:
    if not 0.0 < gamma <= 1.0:
        raise ConfigError(f"gamma must be in (0, 1], got {gamma}")


@dataclass(frozen=True)
class AIRSignals:
    """What the trace says about one transition's consequences (see the module docstring for the rule).

    Attributes:
        tool_calls_ok: tool calls that succeeded (>= 0).
        tool_calls_failed: tool calls that failed (>= 0).
        exceptions: exceptions recorded outside tool calls (>= 0).
        format_valid: the response had the expected format; ``None`` when not checked.
    """

    tool_calls_ok: int = 0
    tool_calls_failed: int = 0
    exceptions: int = 0
    format_valid: bool | None = None


@dataclass(frozen=True)
class AIRWeights:
    """Reward per AIR signal, added to the outcome-based reward of the transition (all finite; unit: reward).

    The defaults penalize failures only. A positive ``tool_call_ok`` rewards every successful call, so an agent can
    learn to call tools more than it needs to; raise it knowingly.

    Attributes:
        tool_call_ok: per successful tool call (default 0.0).
        tool_call_failed: per failed tool call (default -0.1).
        exception: per exception (default -0.2).
        format_valid: when ``format_valid`` is True (default 0.0).
        format_invalid: when ``format_valid`` is False (default -0.1).

    Raises:
        ConfigError: (on construction) a weight is not a finite number.
    """

    tool_call_ok: float = 0.0
    tool_call_failed: float = -0.1
    exception: float = -0.2
    format_valid: float = 0.0
    format_invalid: float = -0.1

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int | float) or not math.isfinite(value):
                raise ConfigError(f"AIR weight {field.name} must be a finite number, got {value!r}")


def air_reward(signals: AIRSignals, weights: AIRWeights) -> float:
    """The intermediate reward of one transition::

        ok * w_ok + failed * w_failed + exceptions * w_exception + (w_format_valid | w_format_invalid | 0)

    the last term by ``format_valid`` being True, False or None.
    """
    fmt = 0.0
    if signals.format_valid is True:
        fmt = weights.format_valid
    elif signals.format_valid is False:
        fmt = weights.format_invalid
    return (
        signals.tool_calls_ok * weights.tool_call_ok
        + signals.tool_calls_failed * weights.tool_call_failed
        + signals.exceptions * weights.exception
        + fmt
    )


def air_signals(metadata: Mapping[str, object]) -> AIRSignals:
    """Read the AIR keys of one transition's ``metadata`` (missing keys: no signal).

    Raises:
        ConfigError: a count is not an int >= 0 (bools are refused), or ``air.format_valid`` is not a bool.
    """
    counts: list[int] = []
    for key in (AIR_TOOL_CALLS_OK, AIR_TOOL_CALLS_FAILED, AIR_EXCEPTIONS):
        value = metadata.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"transition metadata {key!r} must be an int >= 0, got {value!r}")
        counts.append(value)
    fmt = metadata.get(AIR_FORMAT_VALID)
    if fmt is not None and not isinstance(fmt, bool):
        raise ConfigError(f"transition metadata {AIR_FORMAT_VALID!r} must be a bool, got {fmt!r}")
    return AIRSignals(tool_calls_ok=counts[0], tool_calls_failed=counts[1], exceptions=counts[2], format_valid=fmt)


# ---- schemes on trajectories -------------------------------------------------------------------------------------


class CreditAssignment(Protocol):
    """A user credit function: ``(trajectory) -> rewards_T``, one reward per transition, in order."""

    def __call__(self, trajectory: Trajectory, /) -> Sequence[float]: ...


def _final_reward(trajectory: Trajectory) -> float:
    if trajectory.final_reward is None:
        raise ConfigError(
            f"trajectory of rollout {trajectory.rollout_id} has no final reward; only trainable trajectories "
            "(Trajectory.trainable) can be credited"
        )
    return float(trajectory.final_reward)


@dataclass(frozen=True)
class CreditScheme:
    """A named credit-assignment scheme; call it with a trajectory to get ``rewards_T`` (checked).

    Attributes:
        name: shown in error messages.
        assign: ``(trajectory) -> rewards_T``.
        from_outcome: the same scheme as ``(final_reward, n_transitions) -> rewards_T`` when it needs nothing but
            the outcome (``broadcast``, ``discounted``); ``None`` when it reads the transitions.
    """

    name: str
    assign: CreditAssignment
    from_outcome: Callable[[float, int], list[float]] | None = None

    @overload
    def __call__(self, trajectory: Trajectory, /) -> list[float]: ...

    @overload
    def __call__(self, final_reward: float, n_transitions: int, /) -> list[float]: ...

    def __call__(self, trajectory_or_reward: Trajectory | float, n_transitions: int | None = None, /) -> list[float]:
        """``scheme(trajectory)`` -> ``rewards_T``. The older form ``scheme(final_reward, n_transitions)`` works
        for schemes with ``from_outcome`` (it is kept for callers that have no trajectory at hand).

        Raises:
            ConfigError: the trajectory has no final reward; the scheme returned a wrong number of rewards or a
                non-finite one; or the older form is used with a scheme that reads the transitions.
        """
        if isinstance(trajectory_or_reward, Trajectory):
            trajectory = trajectory_or_reward
            return _checked_rewards(
                self.name, trajectory.rollout_id, self.assign(trajectory), len(trajectory.transitions)
            )
        if self.from_outcome is None or n_transitions is None:
            raise ConfigError(
                f"credit assignment {self.name!r} reads the transitions; call it with the trajectory instead"
            )
        return _checked_rewards(self.name, None, self.from_outcome(trajectory_or_reward, n_transitions), n_transitions)


def _checked_rewards(name: str, rollout_id: str | None, rewards: Iterable[float], n_transitions: int) -> list[float]:
    where = f" for rollout {rollout_id}" if rollout_id is not None else ""
    try:
        out = [float(r) for r in rewards]
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"credit assignment {name!r} must return a sequence of numbers{where}, got {type(rewards).__name__} ({exc})"
        ) from None
    if len(out) != n_transitions:
        raise ConfigError(
            f"credit assignment {name!r} returned {len(out)} rewards{where} with {n_transitions} transitions; "
            "it must return one reward per transition"
        )
    for t, r in enumerate(out):
        if not math.isfinite(r):
            raise ConfigError(f"credit assignment {name!r} returned a non-finite reward {r} for transition {t}{where}")
    return out


BROADCAST: Final = CreditScheme(
    "broadcast", lambda trajectory: broadcast(_final_reward(trajectory), len(trajectory.transitions)), broadcast
)
"""The ``broadcast`` scheme (LightningRL's default)."""


def discounted(gamma: float) -> CreditScheme:
    """The ``discounted`` scheme: ``rewards_T[t] = gamma ** (T - 1 - t) * R`` (:func:`discounted_rewards`).

    Raises:
        ConfigError: ``gamma`` outside ``(0, 1]``.
    """
    _check_gamma(gamma)

    def from_outcome(final_reward: float, n_transitions: int) -> list[float]:
        return discounted_rewards(final_reward, n_transitions, gamma)

    return CreditScheme(
        f"discounted(gamma={gamma})",
        lambda trajectory: from_outcome(_final_reward(trajectory), len(trajectory.transitions)),
        from_outcome,
    )


def intermediate(weights: AIRWeights | None = None, base: CreditScheme = BROADCAST) -> CreditScheme:
    """The ``intermediate`` (AIR) scheme: ``base(trajectory)[t] + air_reward(air_signals(metadata_t), weights)``.

    Args:
        weights: reward per signal; default :class:`AIRWeights()`.
        base: the outcome scheme the intermediate rewards are added to (``BROADCAST``, ``discounted(gamma)``...).
    """
    w = weights if weights is not None else AIRWeights()

    def assign(trajectory: Trajectory) -> list[float]:
        rewards = base(trajectory)
        for t, transition in enumerate(trajectory.transitions):
            try:
                signals = air_signals(transition.metadata)
            except ConfigError as exc:
                raise ConfigError(
                    f"rollout {trajectory.rollout_id}, transition {t} (span {transition.span_id}): {exc}"
                ) from None
            rewards[t] += air_reward(signals, w)
        return rewards

    return CreditScheme(f"intermediate({base.name})", assign)


def from_function(fn: CreditAssignment, name: str | None = None) -> CreditScheme:
    """Wrap a user function ``(trajectory) -> rewards_T``; its output is checked on every call."""
    return CreditScheme(name if name is not None else getattr(fn, "__name__", "user function"), fn)


CREDIT_ASSIGNMENT: Registry[CreditScheme] = Registry(
    "credit assignment",
    {"broadcast": BROADCAST, "discounted": discounted(DEFAULT_GAMMA), "intermediate": intermediate()},
)
"""Credit-assignment schemes by name, with default parameters. Add one with :func:`register_credit_assignment`."""


def register_credit_assignment(name: str, implementation: CreditScheme | CreditAssignment) -> None:
    """Register ``implementation`` (a scheme, or a user function wrapped by :func:`from_function`) as ``name``.

    Raises:
        ConfigError: ``name`` is already registered (names are never silently replaced).
    """
    scheme = implementation if isinstance(implementation, CreditScheme) else from_function(implementation, name)
    CREDIT_ASSIGNMENT.register(name, scheme)


def get_credit_assignment(name: str) -> CreditScheme:
    """The scheme registered as ``name``.

    Raises:
        ConfigError: unknown name; the message lists the known ones.
    """
    return CREDIT_ASSIGNMENT.lookup(name)


def resolve_credit_assignment(spec: str | CreditScheme | CreditAssignment) -> CreditScheme:
    """A scheme from a registered name, a scheme, or a user function (wrapped by :func:`from_function`).

    Raises:
        ConfigError: unknown name.
    """
    if isinstance(spec, str):
        return get_credit_assignment(spec)
    if isinstance(spec, CreditScheme):
        return spec
    return from_function(spec)


def build_credit_scheme(
    name: str, *, gamma: float | None = None, air_weights: Mapping[str, float] | None = None
) -> CreditScheme:
    """The scheme a config names, with its parameters.

    Args:
        name: ``broadcast``, ``discounted``, ``intermediate`` or another registered name.
        gamma: the discount: for ``discounted`` (default :data:`DEFAULT_GAMMA`) and, when given, the outcome part of
            ``intermediate`` (``intermediate`` over ``discounted(gamma)`` instead of over ``broadcast``).
        air_weights: :class:`AIRWeights` field -> value, for ``intermediate``; missing fields keep their defaults.

    Raises:
        ConfigError: unknown name, ``gamma`` outside ``(0, 1]``, an unknown or non-finite AIR weight, or a parameter
            given to a scheme that does not take it.
    """
    weights = dict(air_weights or {})
    if name == "discounted":
        if weights:
            raise ConfigError("air_weights apply to credit_assignment 'intermediate' only, not 'discounted'")
        return discounted(DEFAULT_GAMMA if gamma is None else gamma)
    if name == "intermediate":
        known = {f.name for f in fields(AIRWeights)}
        unknown = sorted(set(weights) - known)
        if unknown:
            raise ConfigError(f"unknown AIR weight(s) {unknown}; known: {sorted(known)}")
        base = BROADCAST if gamma is None else discounted(gamma)
        return intermediate(AIRWeights(**weights), base)
    if gamma is not None or weights:
        raise ConfigError(
            f"credit_assignment {name!r} takes no gamma or air_weights; they apply to 'discounted' and 'intermediate'"
        )
    return get_credit_assignment(name)
