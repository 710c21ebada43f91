"""Staleness of off-policy samples under asynchronous training, and what to do with stale ones. Pure, no torch.

Under asynchronous training (:mod:`agentbolt.trainer.pipeline`) rollouts keep running while the trainer updates, so
a call may have been sampled by weights some versions older than those being updated. The gateway stamps every call
with the weights version that generated it (``Transition.metadata["model_version"]``); the trainer knows the ordered
list of versions it has published. The **staleness** of a transition is how many versions its call is behind the
trainer's current version::

    versions = ["base", "step-1", "step-2"]      # oldest -> newest; the trainer is at "step-2"
    staleness("step-2") = 0, staleness("step-1") = 1, staleness("base") = 2, staleness("other") = None (unknown)

A bound ``max_staleness`` (in versions) separates fresh transitions (staleness <= bound: weight 1) from stale ones,
which are either **dropped** (``drop``: loss mask 0, they stay as context of merged samples) or **reweighted**
(``reweight``: the advantage is multiplied by ``decay ** (staleness - max_staleness)``). Scaling the advantage by
``w > 0`` scales that transition's PPO-clip loss by exactly ``w``, since ``min(r A, clip(r) A)`` is positively
homogeneous in ``A``. A call whose version the trainer never published (another run's weights, a missing stamp) is
always dropped. Staleness is per transition, not per rollout: the calls of one rollout that spanned a weight swap
are judged each by its own version, and the group baseline still uses every rollout's outcome (the rewards are valid
whatever weights produced them; only the policy-gradient term is off-policy).

This is the bounded-staleness rule of asynchronous RL systems for LLMs (AReaL, Fu et al. 2025, arXiv:2505.24298,
"staleness-aware training": a sample may lag at most ``eta`` versions); the decayed weight is our option for users
who prefer to keep old samples at a lower weight. Importance-sampling correction of the remaining off-policyness is
separate (``tis_cap`` of the torch backend, :func:`~agentbolt.algorithms.rl.losses.truncated_is_weights`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from agentbolt.errors import ConfigError
from agentbolt.types import Trajectory

StalePolicy = Literal["drop", "reweight"]
STALE_POLICIES: Final[tuple[StalePolicy, ...]] = ("drop", "reweight")
MODEL_VERSION_KEY: Final = "model_version"
"""``Transition.metadata`` key of the weights version that generated the call (set by the adapter from the span)."""


def version_staleness(model_version: str | None, versions: Sequence[str]) -> int | None:
    """Versions between ``model_version`` and the newest of ``versions``.

    Args:
        model_version: the version that generated the call (``None``: not recorded).
        versions: the trainer's published versions, oldest first; the last one is the current version.

    Returns:
        ``len(versions) - 1 - index``, 0 for the current version; ``None`` when ``model_version`` is absent or
        not in ``versions``. A version listed twice counts at its latest position.

    Raises:
        ConfigError: ``versions`` is empty.
    """
    if not versions:
        raise ConfigError("the trainer has published no weights version yet; versions must not be empty")
    if model_version is None:
        return None
    for index in range(len(versions) - 1, -1, -1):
        if versions[index] == model_version:
            return len(versions) - 1 - index
    return None


def staleness_weight(staleness: int | None, max_staleness: int, policy: StalePolicy, decay: float) -> float:
    """Loss weight of a transition ``staleness`` versions behind (module docstring).

    Returns:
        1.0 when ``0 <= staleness <= max_staleness``; under ``drop`` 0.0 beyond it; under ``reweight``
        ``decay ** (staleness - max_staleness)`` beyond it; 0.0 for an unknown version (``None``) under both.

    Raises:
        ConfigError: unknown policy, ``max_staleness < 0``, ``decay`` outside ``(0, 1]``, or ``staleness < 0``.
    """
    check_staleness_settings(max_staleness, policy, decay)
    if staleness is None:
        return 0.0
    if staleness < 0:
        raise ConfigError(f"staleness must be >= 0, got {staleness}")
    if staleness <= max_staleness:
        return 1.0
    if policy == "drop":
        return 0.0
    return decay ** (staleness - max_staleness)


def check_staleness_settings(max_staleness: int, policy: str, decay: float) -> None:
    """Raises ConfigError for an unknown policy, ``max_staleness < 0`` or ``decay`` outside ``(0, 1]``."""
    if policy not in STALE_POLICIES:
        raise ConfigError(f"unknown stale-sample policy {policy!r}; known: {', '.join(STALE_POLICIES)}")
    if max_staleness < 0:
        raise ConfigError(f"max_staleness must be >= 0 versions, got {max_staleness}")
    if not (math.isfinite(decay) and 0 < decay <= 1):
        raise ConfigError(f"the staleness decay must be in (0, 1], got {decay}")


@dataclass
class StalenessReport:
    """What :func:`apply_staleness` did to a step's transitions.

    Attributes:
        by_staleness: transitions per staleness (versions behind; ``-1`` for an unknown version), keys sorted.
        n_dropped: transitions whose loss mask became 0 (stale under ``drop``, or of an unknown version).
        n_reweighted: transitions whose advantage was scaled by a weight < 1 (``reweight``).
        n_unknown_version: transitions whose version the trainer never published (always dropped; counted in
            ``n_dropped`` too when they were trained).
    """

    by_staleness: dict[int, int] = field(default_factory=dict)
    n_dropped: int = 0
    n_reweighted: int = 0
    n_unknown_version: int = 0

    @property
    def n_transitions(self) -> int:
        """Transitions seen."""
        return sum(self.by_staleness.values())

    @property
    def mean_staleness(self) -> float:
        """Mean staleness of the transitions of known version (0.0 when there are none)."""
        known = {s: n for s, n in self.by_staleness.items() if s >= 0}
        total = sum(known.values())
        return sum(s * n for s, n in known.items()) / total if total else 0.0


def apply_staleness(
    trajectories: Sequence[Trajectory],
    advantages: Mapping[str, list[float]],
    trained: Mapping[str, list[bool]],
    *,
    versions: Sequence[str],
    max_staleness: int,
    policy: StalePolicy = "drop",
    decay: float = 0.5,
) -> StalenessReport:
    """Judge every transition's staleness and drop or reweight the stale ones, in place.

    Args:
        trajectories: the step's trained trajectories.
        advantages: ``rollout_id -> (T,)`` per-transition advantages; stale ones are scaled under ``reweight``.
        trained: ``rollout_id -> (T,)`` whether each transition's response is trained; set False for dropped ones.
        versions: the trainer's published versions, oldest first (:func:`version_staleness`).
        max_staleness / policy / decay: the bound and the rule (:func:`staleness_weight`).

    Returns:
        A :class:`StalenessReport`.

    Raises:
        ConfigError: bad settings, an empty ``versions``, or a trajectory missing from ``advantages``/``trained``
            or with lengths that differ from its transitions.
    """
    check_staleness_settings(max_staleness, policy, decay)
    report = StalenessReport()
    counts: dict[int, int] = {}
    for trajectory in trajectories:
        rid = trajectory.rollout_id
        if rid not in advantages or rid not in trained:
            raise ConfigError(f"rollout {rid} has no advantages or trained flags; compute them before staleness")
        adv_T, trained_T = advantages[rid], trained[rid]
        if not len(adv_T) == len(trained_T) == len(trajectory.transitions):
            raise ConfigError(
                f"rollout {rid}: {len(trajectory.transitions)} transitions but {len(adv_T)} advantages and "
                f"{len(trained_T)} trained flags"
            )
        for t, transition in enumerate(trajectory.transitions):
            version = transition.metadata.get(MODEL_VERSION_KEY)
            staleness = version_staleness(None if version is None else str(version), versions)
            key = -1 if staleness is None else staleness
            counts[key] = counts.get(key, 0) + 1
            weight = staleness_weight(staleness, max_staleness, policy, decay)
            if staleness is None:
                report.n_unknown_version += 1
            if weight == 0.0:
                if trained_T[t]:
                    report.n_dropped += 1
                trained_T[t] = False
            elif weight < 1.0:
                adv_T[t] *= weight
                report.n_reweighted += 1
    report.by_staleness = dict(sorted(counts.items()))
    return report
