"""The evaluator that goes through the store: each task becomes a rollout under the candidate's resources version,
run by whatever runners serve the store, and its score and trace are read back from the rollout's spans.

Reading one rollout back (:func:`task_result_from_spans`, over the spans of its latest attempt):
    * **reward**: the last reward span named ``reward_name``, or the final (unnamed) reward when there is none of
      that name or ``reward_name`` is ``None`` (:func:`~agentbolt.adapter.trajectory.accuracy_reward`); 0.0 when
      the rollout did not succeed or has none;
    * **messages**: the request messages of the attempt's last gateway LLM call plus the assistant message it
      returned (a tool loop re-sends the whole conversation, so the last call holds it all); the final reply is
      appended by the same rule;
    * **answer** and **feedback**: the ``agentbolt.reward.answer`` / ``agentbolt.reward.feedback`` attributes of the
      last reward span that has them (the agent sets them with ``emit_reward(..., attributes=...)``); without
      feedback, an exception span or a failed status becomes the feedback (``"the agent raised KeyError: ..."``).

A rollout the agent failed scores its reward (0.0); the store retries infrastructure failures itself
(``RolloutConfig.max_attempts``), so a result is read only once a rollout is terminal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentbolt import semconv
from agentbolt.adapter.join import is_gateway_llm_span
from agentbolt.adapter.trajectory import accuracy_reward, has_named_reward
from agentbolt.store.base import EnqueueRequest, LightningStore
from agentbolt.types import Rollout, RolloutConfig, RolloutMode, RolloutStatus, Span

from .types import Candidate, TaskInput, TaskResult, Trace, task_id_of

RolloutCounter = Callable[[int], None]
"""Called with a count of rollouts (enqueued, or just finished)."""


class StoreEvaluator:
    """An :class:`~.types.Evaluator` over a :class:`~agentbolt.store.base.LightningStore`.

    Args:
        store: the store the runners serve.
        reward_name: which reward is the score (``None``: the final, unnamed one).
        rollout_config: attempts and timeout of each rollout (the store's default when ``None``).
        metadata: extra metadata on every rollout (``{"run_id": ...}``); ``task_id`` and ``candidate`` are added.
        poll_s: how long one wait on the store lasts before progress is reported again (seconds).
        on_enqueued / on_finished: progress hooks, called with the number of rollouts enqueued / newly terminal.

    Attributes:
        rollouts_read / named_reward_seen: rollouts read back so far, and how many of them recorded a reward named
            ``reward_name`` (:func:`~agentbolt.adapter.trajectory.has_named_reward`); with a ``reward_name`` and
            ``named_reward_seen == 0`` every score so far was the final reward, and the caller reports that the
            named reward never appeared (:attr:`reward_name_missing`).
    """

    def __init__(
        self,
        store: LightningStore,
        *,
        reward_name: str | None = None,
        rollout_config: RolloutConfig | None = None,
        metadata: Mapping[str, Any] | None = None,
        poll_s: float = 1.0,
        on_enqueued: RolloutCounter | None = None,
        on_finished: RolloutCounter | None = None,
    ) -> None:
        self.store = store
        self.reward_name = reward_name
        self.rollout_config = rollout_config
        self.metadata = dict(metadata or {})
        self.poll_s = poll_s
        self.on_enqueued = on_enqueued
        self.on_finished = on_finished
        self.rollouts_read = 0
        self.named_reward_seen = 0

    @property
    def reward_name_missing(self) -> bool:
        """``True`` when ``reward_name`` is set, rollouts were read, and not one of them recorded a reward of that
        name (they were scored by their final reward)."""
        return bool(self.reward_name) and self.rollouts_read > 0 and self.named_reward_seen == 0

    async def __call__(
        self, candidate: Candidate, tasks: Sequence[TaskInput], *, mode: RolloutMode
    ) -> list[TaskResult]:
        """Enqueue one rollout per task under ``candidate.candidate_id``, wait until all are terminal, and read each
        back (see the module docstring). Results are in task order."""
        if not tasks:
            return []
        requests = [
            EnqueueRequest(
                input=dict(task),
                mode=mode,
                resources_id=candidate.candidate_id,
                config=self.rollout_config,
                metadata={**self.metadata, "task_id": task_id_of(task), "candidate": candidate.candidate_id},
            )
            for task in tasks
        ]
        rollouts = await self.store.enqueue_many(requests)
        if self.on_enqueued is not None:
            self.on_enqueued(len(rollouts))
        finished = await self._wait([rollout.rollout_id for rollout in rollouts])
        spans = await asyncio.gather(*(self.store.query_spans(rollout.rollout_id) for rollout in finished))
        self.rollouts_read += len(finished)
        self.named_reward_seen += sum(has_named_reward(rollout_spans, self.reward_name) for rollout_spans in spans)
        return [
            task_result_from_spans(task_id_of(task), rollout, rollout_spans, reward_name=self.reward_name)
            for task, rollout, rollout_spans in zip(tasks, finished, spans, strict=True)
        ]

    async def _wait(self, rollout_ids: list[str]) -> list[Rollout]:
        reported = 0
        while True:
            done = await self.store.wait_for_rollouts(rollout_ids, timeout_s=self.poll_s)
            if self.on_finished is not None and len(done) > reported:
                self.on_finished(len(done) - reported)
                reported = len(done)
            if len(done) == len(rollout_ids):
                return done


def task_result_from_spans(
    task_id: str, rollout: Rollout, spans: Sequence[Span], *, reward_name: str | None = None
) -> TaskResult:
    """The :class:`~.types.TaskResult` of one terminal rollout from its latest attempt's spans (rules in the module
    docstring)."""
    succeeded = rollout.status is RolloutStatus.SUCCEEDED
    value = accuracy_reward(spans, reward_name, rollout.final_reward) if succeeded else None
    feedback = _last_attribute(spans, semconv.REWARD_FEEDBACK) or _failure_feedback(rollout, spans)
    trace = Trace(messages=conversation(spans), answer=_last_attribute(spans, semconv.REWARD_ANSWER), feedback=feedback)
    return TaskResult(
        task_id=task_id, reward=0.0 if value is None else value, trace=trace, rollout_id=rollout.rollout_id
    )


def conversation(spans: Sequence[Span]) -> list[dict[str, Any]]:
    """The messages of the attempt's last gateway LLM call (request messages, then the returned assistant message);
    ``[]`` when the agent made no call through the gateway."""
    calls = [span for span in spans if is_gateway_llm_span(span)]
    if not calls:
        return []
    last = calls[-1]
    request = last.attributes.get(semconv.LLM_REQUEST_MESSAGES)
    messages = [dict(m) for m in request if isinstance(m, Mapping)] if isinstance(request, list) else []
    reply = last.attributes.get(semconv.LLM_RESPONSE_MESSAGE)
    if isinstance(reply, Mapping):
        messages.append(dict(reply))
    elif (error := last.attributes.get(semconv.LLM_ERROR)) is not None:
        messages.append({"role": "assistant", "content": f"(the LLM call failed: {error})"})
    return messages


def _last_attribute(spans: Sequence[Span], key: str) -> str | None:
    for span in reversed(spans):
        if span.name == semconv.SPAN_REWARD and isinstance(span.attributes.get(key), str):
            return str(span.attributes[key])
    return None


def _failure_feedback(rollout: Rollout, spans: Sequence[Span]) -> str | None:
    for span in reversed(spans):
        if span.name == semconv.SPAN_EXCEPTION:
            kind = span.attributes.get(semconv.EXCEPTION_TYPE, "an exception")
            message = span.attributes.get(semconv.EXCEPTION_MESSAGE, "")
            return f"the agent raised {kind}: {message}".strip().rstrip(":")
    if rollout.status is not RolloutStatus.SUCCEEDED:
        return f"the rollout ended {rollout.status.value} without a reward"
    return None
