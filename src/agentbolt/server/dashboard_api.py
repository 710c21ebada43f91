"""The JSON API of the dashboard under ``/v1``: rollout search, an attempt's transitions, scores per resources
version, an error summary and metric names. Read-only; every route goes through the store contract.

- ``GET /v1/rollouts/search``: :meth:`~agentbolt.store.base.LightningStore.search_rollouts` (``{"items", "total"}``).
- ``GET /v1/rollouts/{rollout_id}/transitions``: the attempt's LLM calls as training saw them. When the trainer
  recorded the step (:meth:`~agentbolt.store.base.LightningStore.query_trained_samples`, written before each update),
  the rewards, advantages, loss masks and sample boundaries are those the update used, whatever the estimator, credit
  scheme, staleness rule or ``agent_match`` (``advantage_source: "trained"``). Otherwise (a val/test rollout, a store
  written before the trainer recorded its batches) they are recomputed as ``agentbolt export --kind rl`` does
  (:func:`agentbolt.adapter.export_rows.rl_rows`, GRPO and ``broadcast`` credit, unmerged) over the rollout's group:
  the finished rollouts with the same ``metadata.task_id``, ``metadata.train_step``, mode and resources version
  (``advantage_source: "recomputed"``; the run may have used other settings).
- ``GET /v1/resources/scores``: rollout count and mean ``final_reward`` per resources version, overall and by mode
  (from :meth:`~agentbolt.store.base.LightningStore.reward_stats`, one ``GROUP BY`` in the store).
- ``GET /v1/resources/reward-stats``: :meth:`~agentbolt.store.base.LightningStore.reward_stats` as it is (the HTTP
  client's backing route).
- ``GET /v1/errors/summary``: failed, timed-out and unresponsive attempts of the most recently ended failed
  rollouts, by kind, with a time series per kind.
- ``GET /v1/metrics/names``: the distinct metric names (``GET /v1/metrics?name=`` serves the points).

The token of a server started with one guards these routes like every other (``/v1`` is behind the middleware).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import BaseModel, ValidationError

from agentbolt import semconv
from agentbolt.adapter import build_trajectory
from agentbolt.adapter.causes import BAD_REWARD, NO_GATEWAY_CALL, NO_REWARD
from agentbolt.adapter.export_rows import FinishedRollout, rl_rows
from agentbolt.adapter.signals import infrastructure_failure, is_tool_span
from agentbolt.server.errors import error_responses
from agentbolt.store import rules
from agentbolt.store.base import LightningStore
from agentbolt.store.search import MAX_SEARCH_LIMIT, ResourceRewardStats, RolloutPage, RolloutSearch
from agentbolt.types import (
    TERMINAL_ROLLOUT_STATUSES,
    Attempt,
    AttemptStatus,
    Rollout,
    RolloutMode,
    RolloutStatus,
    Span,
    TrainedCall,
    TrainedSample,
)
from agentbolt.types.bounds import INT64_MAX

router = APIRouter(prefix="/v1", tags=["dashboard"])

FAILED_ATTEMPT_STATUSES: Final = frozenset({AttemptStatus.FAILED, AttemptStatus.TIMEOUT, AttemptStatus.UNRESPONSIVE})
"""Attempt statuses the error summary counts."""
ERROR_LABELS: Final[dict[str, str]] = {
    "timeout": "Attempt timed out",
    "unresponsive": "Runner stopped sending heartbeats",
    "gateway_error": "Inference backend failed (gateway)",
    "llm_error": "LLM call refused (e.g. context length)",
    "tool_failure": "A tool call failed",
    "no_reward": "The agent returned None and emitted no reward",
    "bad_reward": "The agent returned something that is not a reward",
    "no_gateway_call": "The agent made no LLM call through its llm.endpoint (nothing to train)",
}
"""Human labels of the error kinds; ``agent_exception:<type>`` kinds are labelled with the exception type."""
MIN_BUCKET_S: Final = 0.001
MAX_BUCKET_S: Final = 366 * 86_400.0
"""Bounds of the error summary's bucket width: a millisecond to a year (a tinier width overflows the bucket index)."""


def _store(request: Request) -> LightningStore:
    return request.app.state.store


# ------------------------------------------------------------------------------------------------------ search
@router.get("/rollouts/search", response_model=RolloutPage)
async def search_rollouts(
    request: Request,
    status: str | None = Query(None, description="comma-separated rollout statuses, e.g. succeeded,failed"),
    mode: RolloutMode | None = None,
    resources_id: str | None = None,
    reward_min: float | None = Query(None, allow_inf_nan=False, description="inclusive lower bound on final_reward"),
    reward_max: float | None = Query(None, allow_inf_nan=False, description="inclusive upper bound on final_reward"),
    q: str | None = Query(None, description="case-insensitive substring of the rollout id or the input's JSON"),
    metadata: str | None = Query(None, description='JSON object of metadata equalities, e.g. {"task_id": "t1"}'),
    sort_by: str = Query(rules.DEFAULT_ROLLOUT_SORT, description=f"one of {', '.join(rules.ROLLOUT_SORT_FIELDS)}"),
    descending: bool = False,
    limit: int = Query(50, ge=0, le=MAX_SEARCH_LIMIT),
    offset: int = Query(0, ge=0, le=INT64_MAX),
) -> RolloutPage:
    """Rollouts matching every filter, sorted and paged, with the total number that matched (422 on bad input)."""
    try:
        statuses = None if status is None else tuple(RolloutStatus(s.strip()) for s in status.split(",") if s.strip())
        search = RolloutSearch(
            status=statuses,
            mode=mode,
            resources_id=resources_id,
            metadata=None if metadata is None else json.loads(metadata),
            reward_min=reward_min,
            reward_max=reward_max,
            text=q,
            sort_by=sort_by,
            descending=descending,
            limit=limit,
            offset=offset,
        )
    except (ValueError, ValidationError) as exc:  # ValidationError is a ValueError; both named for the reader
        raise HTTPException(422, f"bad rollout search: {exc}") from None
    items, total = await _store(request).search_rollouts(search)
    return RolloutPage(items=items, total=total)


# ------------------------------------------------------------------------------------------------- transitions
class PromptToken(BaseModel):
    """A prompt token: its id and text (``None`` when the server has no tokenizer)."""

    id: int
    text: str | None


class ResponseToken(BaseModel):
    """A generated token: id, text, sampling logprob, ``loss_mask`` 1 when training uses it (0: not trained), and
    the ``advantage`` applied to it (``None`` where the loss mask is 0 or nothing is known)."""

    id: int
    text: str | None
    logprob: float
    loss_mask: int
    advantage: float | None = None


AdvantageSource = Literal["trained", "recomputed"]
"""Where a transition's advantages come from: ``trained``, the values the trainer recorded for the update of
``train_step``; ``recomputed``, computed now with GRPO and ``broadcast`` credit because the trainer recorded none."""

RECOMPUTED_ESTIMATOR: Final = "grpo"
RECOMPUTED_CREDIT: Final = "broadcast"
"""The settings of a recomputation (the run may have used others)."""


class TransitionView(BaseModel):
    """One LLM call of an attempt as training sees it.

    ``advantage_source`` says where ``reward``, ``advantage`` and the loss masks come from (:data:`AdvantageSource`);
    ``advantage_estimator`` and ``credit_assignment`` name the settings that made them, and ``train_step`` the step
    (the recorded one, or the rollout's ``metadata.train_step`` when recomputed). ``None`` throughout: nothing to
    show (a val rollout, no ``task_id``, a failed attempt...).

    ``reward``: the reward credit assignment gave the call, else the reward attached by the adapter, else ``None``.
    ``advantage``: the advantage of the call's tokens in the loss (0.0 included: the update then skipped the
    sample, see ``trained``); ``None`` when the call was not in the loss (left out of the batch, e.g. by
    ``agent_match``, dropped to context as stale, or not computable), and under ``gae``, whose advantages are per
    token (``response[k].advantage``). ``sample_index``: the position of the call's sample in the update's batch, and
    ``sample_span_ids`` the calls merged into that sample, in order (``None`` when not recorded). ``trained``: whether
    the update learned from the call: False when it was left out of the batch, dropped to context (stale), or its
    sample was skipped for an advantage of exactly 0; ``None`` when not recorded. ``staleness`` /
    ``staleness_weight``: how many weights versions the call was behind the trainer, and what its advantage was
    multiplied by (asynchronous training).
    """

    index: int
    span_id: str | None
    agent_name: str | None
    prompt: list[PromptToken]
    response: list[ResponseToken]
    reward: float | None
    advantage: float | None
    model_version: str | None
    advantage_source: AdvantageSource | None = None
    advantage_estimator: str | None = None
    credit_assignment: str | None = None
    train_step: int | None = None
    sample_index: int | None = None
    sample_span_ids: list[str] | None = None
    trained: bool | None = None
    staleness: int | None = None
    staleness_weight: float | None = None


def _decoder(request: Request) -> Any:
    """The embedded backend's tokenizer, or ``None`` (other backends have none the server can use)."""
    return getattr(request.app.state.backend, "tokenizer", None)


def _texts(tokenizer: Any, ids: Sequence[int]) -> list[str | None]:
    if tokenizer is None:
        return [None] * len(ids)
    return [tokenizer.decode([i]) for i in ids]


async def _group_rows(store: LightningStore, rollout: Rollout, attempt: Attempt) -> dict[str, dict[str, Any]]:
    """The ``rl`` rows of ``rollout`` (span id of their one call -> row), computed over its group; ``{}`` when it
    has no group (no ``task_id``) or is not trained."""
    task_id = rollout.metadata.get("task_id")
    if task_id is None or rollout.mode is not RolloutMode.TRAIN:
        return {}
    equal: dict[str, str | int] = {"task_id": task_id} if isinstance(task_id, (str, int)) else {}
    train_step = rollout.metadata.get("train_step")
    if isinstance(train_step, int) and not isinstance(train_step, bool):
        equal["train_step"] = train_step
    search = RolloutSearch(
        status=tuple(sorted(TERMINAL_ROLLOUT_STATUSES)),
        mode=rollout.mode,
        resources_id=rollout.resources_id,
        metadata=equal or None,
        limit=MAX_SEARCH_LIMIT,
    )
    members, _ = await store.search_rollouts(search)
    resources_id = rollout.resources_id or attempt.resources_id
    finished: list[FinishedRollout] = []
    for member in members:
        if member.metadata.get("task_id") != task_id or member.metadata.get("train_step") != train_step:
            continue
        attempts = await store.query_attempts(member.rollout_id)
        last = attempts[-1] if attempts else None
        if (member.resources_id or (last.resources_id if last else None)) != resources_id:
            continue
        spans = await store.query_spans(member.rollout_id, last.attempt_id) if last is not None else []
        finished.append(FinishedRollout(member, last, spans))
    rows, _ = rl_rows(finished, merge_samples=False)
    return {
        row["span_ids"][0]: row
        for row in rows
        if row["rollout_id"] == rollout.rollout_id and row["attempt_id"] == attempt.attempt_id and row["span_ids"]
    }


@dataclass
class _Recorded:
    """What the trainer recorded for one attempt: its step and settings, and each trained call's sample."""

    train_step: int
    advantage_estimator: str
    credit_assignment: str
    calls: dict[str, tuple[TrainedSample, TrainedCall]] = field(default_factory=dict)


def _int_step(rollout: Rollout) -> int | None:
    value = rollout.metadata.get("train_step")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def _recorded(store: LightningStore, rollout: Rollout, attempt: Attempt) -> _Recorded | None:
    """The trainer's record of ``attempt`` (the latest step that trained it); an empty one when the rollout's step
    (or another attempt of it) was recorded without this attempt's calls; ``None`` when nothing was recorded."""
    of_rollout = await store.query_trained_samples(rollout_id=rollout.rollout_id)
    mine = [r for r in of_rollout if r.attempt_id == attempt.attempt_id]
    if mine:
        step = max(r.train_step for r in mine)
        mine = [r for r in mine if r.train_step == step]
        recorded = _Recorded(step, mine[0].advantage_estimator, mine[0].credit_assignment)
        recorded.calls = {call.span_id: (record, call) for record in mine for call in record.calls}
        return recorded
    step = _int_step(rollout)
    others = of_rollout or (await store.query_trained_samples(train_step=step) if step is not None else [])
    if not others or rollout.mode is not RolloutMode.TRAIN:
        return None
    return _Recorded(others[-1].train_step, others[-1].advantage_estimator, others[-1].credit_assignment)


def _recorded_fields(
    recorded: _Recorded, span_id: str | None, n_response: int
) -> tuple[dict[str, Any], list[int], list[float | None]]:
    """``(TransitionView fields, loss mask, token advantages)`` of one call under a record (``n_response`` tokens)."""
    fields: dict[str, Any] = {
        "advantage_source": "trained",
        "advantage_estimator": recorded.advantage_estimator,
        "credit_assignment": recorded.credit_assignment,
        "train_step": recorded.train_step,
        "trained": False,
        "advantage": None,
    }
    found = recorded.calls.get(span_id or "")
    if found is None or found[1].response_end - found[1].response_start != n_response:
        return fields, [0] * n_response, [None] * n_response  # not in the batch
    record, call = found
    by_position = record.advantages_by_position()
    advantages = [by_position.get(call.response_start + k) for k in range(n_response)]
    in_loss = any(a is not None for a in advantages)  # False when the call was dropped to context (stale)
    fields.update(
        trained=record.trained and in_loss,
        advantage=record.advantage if in_loss and record.token_advantages is None else None,
        sample_index=record.sample_index,
        sample_span_ids=[c.span_id for c in record.calls],
        staleness=call.staleness,
        staleness_weight=call.staleness_weight,
    )
    if call.reward is not None:
        fields["reward"] = call.reward
    return fields, [0 if a is None else 1 for a in advantages], advantages


@router.get("/rollouts/{rollout_id}/transitions", response_model=list[TransitionView], responses=error_responses(404))
async def rollout_transitions(rollout_id: str, request: Request, attempt_id: str | None = None) -> list[TransitionView]:
    """The LLM calls of one attempt (default: the latest) with token texts, rewards and advantages; 404 if unknown."""
    store = _store(request)
    rollout = await store.get_rollout(rollout_id)
    if attempt_id is None:
        attempts = await store.query_attempts(rollout_id)
        if not attempts:
            return []
        attempt = attempts[-1]
    else:
        attempt = await store.get_attempt(rollout_id, attempt_id)
    spans = await store.query_spans(rollout_id, attempt.attempt_id)
    trajectory = build_trajectory(rollout, attempt.attempt_id, spans)
    recorded = await _recorded(store, rollout, attempt)
    rows = await _group_rows(store, rollout, attempt) if recorded is None else {}
    tokenizer = _decoder(request)
    out: list[TransitionView] = []
    for index, transition in enumerate(trajectory.transitions):
        n_response = len(transition.response_token_ids)
        fields: dict[str, Any] = {"reward": transition.reward, "advantage": None}
        mask: list[int] = [0] * n_response
        advantages: list[float | None] = [None] * n_response
        row = rows.get(transition.span_id or "")
        if recorded is not None:
            extra, mask, advantages = _recorded_fields(recorded, transition.span_id, n_response)
            fields.update(extra)
        elif row is not None:
            fields.update(
                advantage_source="recomputed",
                advantage_estimator=RECOMPUTED_ESTIMATOR,
                credit_assignment=RECOMPUTED_CREDIT,
                train_step=_int_step(rollout),
                advantage=float(row["advantage"]),
            )
            if row["transition_rewards"]:
                fields["reward"] = row["transition_rewards"][0]
            if len(row["response_loss_mask"]) == n_response:
                mask = [int(m) for m in row["response_loss_mask"]]
                advantages = [float(row["advantage"]) if m else None for m in mask]
        reward = fields.pop("reward")
        model_version = transition.metadata.get("model_version")
        out.append(
            TransitionView(
                index=index,
                span_id=transition.span_id,
                agent_name=transition.agent_name,
                prompt=[
                    PromptToken(id=i, text=t)
                    for i, t in zip(
                        transition.prompt_token_ids, _texts(tokenizer, transition.prompt_token_ids), strict=True
                    )
                ],
                response=[
                    ResponseToken(id=i, text=t, logprob=lp, loss_mask=mask[k], advantage=advantages[k])
                    for k, (i, t, lp) in enumerate(
                        zip(
                            transition.response_token_ids,
                            _texts(tokenizer, transition.response_token_ids),
                            transition.sampling_logprobs,
                            strict=True,
                        )
                    )
                ],
                reward=None if reward is None else float(reward),
                model_version=None if model_version is None else str(model_version),
                **fields,
            )
        )
    return out


# ------------------------------------------------------------------------------------------------------ scores
class ModeScore(BaseModel):
    """Finished rollouts with a reward (``n``) and their mean ``final_reward`` (``None`` when ``n == 0``)."""

    n: int
    mean_reward: float | None


class ResourcesScore(ModeScore):
    """:class:`ModeScore` over every mode, and per mode (``train``, ``val``, ``test``)."""

    by_mode: dict[str, ModeScore]


@router.get("/resources/reward-stats", response_model=list[ResourceRewardStats])
async def resources_reward_stats(request: Request) -> list[ResourceRewardStats]:
    """:meth:`~agentbolt.store.base.LightningStore.reward_stats`: finished rollouts, how many have a reward, and its
    mean, per (resources version, mode)."""
    return await _store(request).reward_stats()


@router.get("/resources/scores", response_model=dict[str, ResourcesScore])
async def resources_scores(request: Request) -> dict[str, ResourcesScore]:
    """Mean ``final_reward`` of the finished (succeeded or failed) rollouts with a reward, per pinned resources
    version, overall and by mode. Rollouts enqueued for "the latest" version (``resources_id`` null) are left out.
    One store-side ``GROUP BY`` (:meth:`~agentbolt.store.base.LightningStore.reward_stats`)."""
    by_version: dict[str, dict[str, ModeScore]] = {}
    for stats in await _store(request).reward_stats():
        if stats.resources_id is None or stats.n_with_reward == 0:
            continue
        score = ModeScore(n=stats.n_with_reward, mean_reward=stats.mean_reward)
        by_version.setdefault(stats.resources_id, {})[stats.mode.value] = score
    out: dict[str, ResourcesScore] = {}
    for resources_id, by_mode in by_version.items():
        n = sum(s.n for s in by_mode.values())
        total = math.fsum(s.n * (s.mean_reward or 0.0) for s in by_mode.values())
        out[resources_id] = ResourcesScore(n=n, mean_reward=total / n, by_mode=dict(sorted(by_mode.items())))
    return out


# ------------------------------------------------------------------------------------------------------ errors
class ErrorExample(BaseModel):
    """The most recent attempt of one error kind."""

    rollout_id: str
    attempt_id: str


class ErrorKind(BaseModel):
    """One kind of failure: how many attempts, a ``(bucket_start_epoch_s, count)`` series, one example."""

    kind: str
    label: str
    count: int
    series: list[tuple[float, int]]
    example: ErrorExample


class ErrorSummary(BaseModel):
    """Error kinds, most frequent first."""

    kinds: list[ErrorKind]


def error_kind(attempt: Attempt, spans: Sequence[Span]) -> str:
    """The kind of a failed attempt, first rule that applies: ``timeout``/``unresponsive`` (attempt status),
    ``gateway_error`` (an infrastructure error code on an LLM span,
    :func:`agentbolt.adapter.signals.infrastructure_failure`), ``agent_exception:<type>`` (the attempt's
    ``error.type``, else the first ``agentbolt.exception`` span's ``exception.type``), ``tool_failure`` (a tool span
    with status ERROR), ``llm_error`` (an LLM span with an error), else ``agent_exception:unknown``. A runner's
    ``error.cause`` of ``no_reward`` or ``bad_reward`` is the kind itself."""
    if attempt.status in (AttemptStatus.TIMEOUT, AttemptStatus.UNRESPONSIVE):
        return attempt.status.value
    if infrastructure_failure(attempt.status, spans) is not None:
        return "gateway_error"
    cause = (attempt.error or {}).get("cause")
    if cause in (NO_REWARD, BAD_REWARD):  # named by the runner (agentbolt.adapter.causes)
        return str(cause)
    error_type = (attempt.error or {}).get("type")
    if not error_type:
        for span in spans:
            if span.name == semconv.SPAN_EXCEPTION and span.attributes.get(semconv.EXCEPTION_TYPE):
                error_type = span.attributes[semconv.EXCEPTION_TYPE]
                break
    if error_type:
        return f"agent_exception:{error_type}"
    if any(is_tool_span(s) and s.status.code == "ERROR" for s in spans):
        return "tool_failure"
    if any(
        s.name == semconv.SPAN_LLM_CALL
        and (s.attributes.get(semconv.LLM_ERROR) or s.attributes.get(semconv.LLM_ERROR_CODE))
        for s in spans
    ):
        return "llm_error"
    return "agent_exception:unknown"


@router.get("/errors/summary", response_model=ErrorSummary)
async def errors_summary(
    request: Request,
    bucket_s: float = Query(
        60.0, ge=MIN_BUCKET_S, le=MAX_BUCKET_S, allow_inf_nan=False, description="width of a series bucket, seconds"
    ),
    max_rollouts: int = Query(500, ge=1, le=10_000, description="failed rollouts read, most recently ended first"),
) -> ErrorSummary:
    """Failed/timeout/unresponsive attempts of the ``max_rollouts`` most recently ended failed rollouts, by kind,
    and ``no_gateway_call``: the most recently ended succeeded rollouts (at most 200) whose last attempt recorded no
    LLM call. Cancellations are not errors and are left out. Buckets start at multiples of ``bucket_s`` (attempt end
    time)."""
    store = _store(request)
    failed = await store.query_rollouts(
        status=[RolloutStatus.FAILED], sort_by="end_time", descending=True, limit=max_rollouts
    )
    counts: dict[str, dict[float, int]] = {}
    examples: dict[str, tuple[float, ErrorExample]] = {}

    def count(kind: str, attempt: Attempt) -> None:
        when = attempt.end_time if attempt.end_time is not None else attempt.start_time
        series = counts.setdefault(kind, {})
        bucket = math.floor(when / bucket_s) * bucket_s
        series[bucket] = series.get(bucket, 0) + 1
        if kind not in examples or when > examples[kind][0]:
            examples[kind] = (when, ErrorExample(rollout_id=attempt.rollout_id, attempt_id=attempt.attempt_id))

    for rollout in failed:
        for attempt in await store.query_attempts(rollout.rollout_id):
            if attempt.status not in FAILED_ATTEMPT_STATUSES or (attempt.error or {}).get("type") == "cancelled":
                continue
            count(error_kind(attempt, await store.query_spans(rollout.rollout_id, attempt.attempt_id)), attempt)
    # Succeeded rollouts without a single gateway call give nothing to train on (the agent missed llm.endpoint).
    succeeded = await store.query_rollouts(
        status=[RolloutStatus.SUCCEEDED], sort_by="end_time", descending=True, limit=min(max_rollouts, 200)
    )
    for rollout in succeeded:
        attempts = await store.query_attempts(rollout.rollout_id)
        if not attempts:
            continue
        spans = await store.query_spans(rollout.rollout_id, attempts[-1].attempt_id)
        if not any(span.name == semconv.SPAN_LLM_CALL for span in spans):
            count(NO_GATEWAY_CALL, attempts[-1])
    kinds = [
        ErrorKind(
            kind=kind,
            label=ERROR_LABELS.get(kind, kind.removeprefix("agent_exception:") + " raised by the agent"),
            count=sum(series.values()),
            series=sorted(series.items()),
            example=examples[kind][1],
        )
        for kind, series in counts.items()
    ]
    kinds.sort(key=lambda k: (-k.count, k.kind))
    return ErrorSummary(kinds=kinds)


# ----------------------------------------------------------------------------------------------------- metrics
@router.get("/metrics/names", response_model=list[str])
async def metric_names(request: Request) -> list[str]:
    """The distinct names of the stored metrics, sorted."""
    return sorted({m.name for m in await _store(request).query_metrics()})
