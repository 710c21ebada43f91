"""Rollout search for the dashboard: the filter model and its pure, in-memory reference semantics.

:meth:`~agentbolt.store.base.LightningStore.search_rollouts` takes a :class:`RolloutSearch` and returns one page of
rollouts plus the number of rollouts matching the filters (``total``, before paging). The SQL backends translate the
same rules to SQL (:mod:`agentbolt.store.sqlite_search`, :mod:`agentbolt.store.postgres_search`); the memory backend
uses :func:`search_page` here. The contract suite (``tests/contract/test_store_search_contract.py``) pins them.

:meth:`~agentbolt.store.base.LightningStore.reward_stats` (the dashboard's scores per resources version) is one
``GROUP BY resources_id, mode`` over the finished rollouts in SQL; :func:`reward_stats` here is its reference.

Text search (``text``): a case-insensitive substring of the rollout's ``rollout_id`` or of the JSON text of its
``input``. Case folding is ASCII-only (``A-Z`` to ``a-z``) in every backend, so that SQL's ``lower()`` and Python agree.
Match on values (strings, numbers, keys): the JSON separators differ between backends (PostgreSQL's ``jsonb`` text
puts a space after ``:`` and ``,``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import to_json

from agentbolt.store import rules
from agentbolt.types import Rollout, RolloutMode, RolloutStatus

MAX_SEARCH_LIMIT: Final = 1000
"""Largest page :class:`RolloutSearch` accepts (``limit``)."""

_KEY: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASCII_LOWER: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def ascii_lower(text: str) -> str:
    """``text`` with ``A-Z`` mapped to ``a-z`` and every other character unchanged (SQL ``lower()`` in SQLite)."""
    return text.translate(_ASCII_LOWER)


class RolloutSearch(BaseModel):
    """Filters, order and page of a rollout search. Every given filter must hold (AND); ``None`` means "any".

    Attributes:
        status: rollout statuses to keep (any of them); an empty tuple matches nothing.
        mode: ``train``, ``val`` or ``test``.
        resources_id: the rollout's ``resources_id`` (rollouts enqueued for "latest" have ``None`` and never match).
        metadata: metadata keys (identifiers: letters, digits, ``_``) and the string or integer value each must equal
            (how the trainer's GRPO groups are found: ``task_id``, ``train_step``).
        reward_min / reward_max: inclusive bounds on ``final_reward``; a rollout without one never matches a bound.
        text: case-insensitive (ASCII) substring of ``rollout_id`` or of the JSON text of ``input``; ``""`` is no
            filter.
        sort_by: one of :data:`agentbolt.store.rules.ROLLOUT_SORT_FIELDS`, with the ordering rules of
            ``query_rollouts`` (missing values last in either direction, ties in enqueue order).
        descending: reverse the order.
        limit: page size, 0 to :data:`MAX_SEARCH_LIMIT`.
        offset: rows skipped before the page.

    Raises:
        pydantic.ValidationError: a bad value (``limit`` out of range, negative ``offset``, unknown ``sort_by``,
            ``reward_min > reward_max``); the HTTP layer answers it with 422.
    """

    model_config = ConfigDict(frozen=True)

    status: tuple[RolloutStatus, ...] | None = None
    mode: RolloutMode | None = None
    resources_id: str | None = None
    metadata: dict[str, str | int] | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    text: str | None = None
    sort_by: str = rules.DEFAULT_ROLLOUT_SORT
    descending: bool = False
    limit: int = Field(default=50, ge=0, le=MAX_SEARCH_LIMIT)
    offset: int = Field(default=0, ge=0)

    @field_validator("sort_by")
    @classmethod
    def _known_sort(cls, value: str) -> str:
        if value not in rules.ROLLOUT_SORT_FIELDS:
            raise ValueError(f"sort_by must be one of: {', '.join(rules.ROLLOUT_SORT_FIELDS)}; got {value!r}")
        return value

    @field_validator("metadata", mode="before")
    @classmethod
    def _identifier_keys(cls, value: object) -> object:
        for key, item in value.items() if isinstance(value, dict) else ():
            if not _KEY.fullmatch(key):
                raise ValueError(f"metadata filter keys must be identifiers ([A-Za-z_][A-Za-z0-9_]*), got {key!r}")
            if isinstance(item, bool):
                raise ValueError(f"metadata filter values must be strings or integers, got {item!r} for {key!r}")
        return value

    @model_validator(mode="after")
    def _ordered_bounds(self) -> RolloutSearch:
        if self.reward_min is not None and self.reward_max is not None and self.reward_min > self.reward_max:
            raise ValueError(f"reward_min ({self.reward_min}) must not exceed reward_max ({self.reward_max})")
        return self

    @property
    def needle(self) -> str | None:
        """The lower-cased (ASCII) search text, or ``None`` when there is no text filter."""
        return ascii_lower(self.text) if self.text else None


class RolloutPage(BaseModel):
    """One page of a rollout search (``items``) and the number of rollouts matching the filters (``total``, before
    paging): the body of ``GET /v1/rollouts/search``."""

    items: list[Rollout]
    total: int


def matches(rollout: Rollout, search: RolloutSearch) -> bool:
    """Whether ``rollout`` passes every filter of ``search`` (the reference the SQL backends follow)."""
    if search.status is not None and rollout.status not in search.status:
        return False
    if search.mode is not None and rollout.mode != search.mode:
        return False
    if search.resources_id is not None and rollout.resources_id != search.resources_id:
        return False
    for key, value in (search.metadata or {}).items():
        found = rollout.metadata.get(key)
        if isinstance(found, bool) or not isinstance(found, (str, int, float)) or found != value:
            return False
    if search.reward_min is not None or search.reward_max is not None:
        reward = rollout.final_reward
        if reward is None:
            return False
        if search.reward_min is not None and reward < search.reward_min:
            return False
        if search.reward_max is not None and reward > search.reward_max:
            return False
    needle = search.needle
    if needle is not None:
        haystacks = (rollout.rollout_id, to_json(rollout.input).decode())
        if not any(needle in ascii_lower(h) for h in haystacks):
            return False
    return True


def search_page(rollouts_in_enqueue_order: Iterable[Rollout], search: RolloutSearch) -> tuple[list[Rollout], int]:
    """The page of ``search`` over ``rollouts_in_enqueue_order`` and the number that matched before paging."""
    found = [r for r in rollouts_in_enqueue_order if matches(r, search)]
    ordered = rules.sort_rollouts(found, search.sort_by, search.descending)
    return ordered[search.offset : search.offset + search.limit], len(found)


# ------------------------------------------------------------------------------------------------ reward stats
FINISHED_STATUSES: Final = (RolloutStatus.SUCCEEDED, RolloutStatus.FAILED)
"""The rollout statuses :meth:`~agentbolt.store.base.LightningStore.reward_stats` counts ("finished": ended by an
attempt, not cancelled)."""


class ResourceRewardStats(BaseModel):
    """Finished (succeeded or failed) rollouts of one resources version and mode, and their rewards.

    Attributes:
        resources_id: the rollouts' ``resources_id``; ``None`` groups the rollouts enqueued for "the latest" version.
        mode: ``train``, ``val`` or ``test``.
        n: finished rollouts in the group.
        n_with_reward: those with a ``final_reward``.
        mean_reward: mean ``final_reward`` of those; ``None`` when ``n_with_reward == 0``.
    """

    model_config = ConfigDict(frozen=True)

    resources_id: str | None
    mode: RolloutMode
    n: int
    n_with_reward: int
    mean_reward: float | None


def reward_stats_order(stats: Iterable[ResourceRewardStats]) -> list[ResourceRewardStats]:
    """``stats`` in the contract's order: ``resources_id`` (``None`` first, then by string), then mode."""
    return sorted(stats, key=lambda s: (s.resources_id is not None, s.resources_id or "", s.mode.value))


def reward_stats(rollouts: Iterable[Rollout]) -> list[ResourceRewardStats]:
    """:class:`ResourceRewardStats` of ``rollouts``, one per (resources version, mode) with a finished rollout (the
    reference the SQL backends' ``GROUP BY`` follows)."""
    groups: dict[tuple[str | None, RolloutMode], tuple[int, list[float]]] = {}
    for rollout in rollouts:
        if rollout.status not in FINISHED_STATUSES:
            continue
        key = (rollout.resources_id, rollout.mode)
        n, rewards = groups.get(key, (0, []))
        if rollout.final_reward is not None:
            rewards.append(rollout.final_reward)
        groups[key] = (n + 1, rewards)
    return reward_stats_order(
        ResourceRewardStats(
            resources_id=resources_id,
            mode=mode,
            n=n,
            n_with_reward=len(rewards),
            mean_reward=math.fsum(rewards) / len(rewards) if rewards else None,
        )
        for (resources_id, mode), (n, rewards) in groups.items()
    )
