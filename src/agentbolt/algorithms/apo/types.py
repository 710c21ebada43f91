"""The data that flows through prompt optimization, and the two injected interfaces.

Shapes:
    * a **candidate** is a dict of named prompts (``{"prompt_template": "..."}``; several names for a multi-agent
      system), published as one resources version; its ``candidate_id`` *is* that ``resources_id``;
    * an **evaluator** runs a candidate on tasks and returns one :class:`TaskResult` per task, in task order;
    * the optimizer LLM is any OpenAI-compatible ``chat.completions.create`` coroutine (see :mod:`.optimizer_llm`).

Every score therefore names the resources version it was produced under, and the evaluator enqueues its rollouts
with that ``resources_id`` (``EnqueueRequest.resources_id``), so a score is traceable to its rollouts in the store.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agentbolt.errors import ConfigError
from agentbolt.types import RolloutMode

TaskInput = Mapping[str, object]
"""One task as the agent receives it; must hold a string ``task_id`` (see :func:`task_id_of`)."""

Message = Mapping[str, object]
"""One OpenAI-format chat message (``role``, ``content``, optional ``tool_calls`` / ``tool_call_id``)."""


@dataclass(frozen=True)
class Trace:
    """What the optimizer LLM is shown of one rollout.

    Attributes:
        messages: the conversation in OpenAI format, tool calls and tool results included.
        answer: the agent's final answer as parsed by the reward (``None`` when it gave none).
        feedback: a sentence from the reward about this rollout (``"expected Nova, answered Lyra"``); GEPA calls
            this textual feedback (Agrawal et al., 2025, section 3.2, "feedback function").
    """

    messages: Sequence[Message] = ()
    answer: str | None = None
    feedback: str | None = None


@dataclass(frozen=True)
class TaskResult:
    """The outcome of one candidate on one task.

    Attributes:
        task_id: the task's ``task_id``.
        reward: the rollout's final reward (higher is better; the room agent uses 0.0 or 1.0).
        trace: what happened, for the optimizer; ``None`` when the evaluator has no trace (e.g. a failed rollout).
        rollout_id: the store's rollout, when the evaluator went through the store.
    """

    task_id: str
    reward: float
    trace: Trace | None = None
    rollout_id: str | None = None


@dataclass(frozen=True)
class Candidate:
    """One prompt candidate, already published as a resources version.

    Attributes:
        candidate_id: the ``resources_id`` of its resources version (``rs-<n>``).
        prompts: prompt name -> template text.
        parent_ids: the candidates it was made from (none for the seed, one for an edit, two for a merge).
        origin: ``"seed"``, ``"edit"`` (APO), ``"reflect"`` or ``"merge"`` (GEPA).
        round_index: the APO round or GEPA iteration that made it (0 for the seed).
    """

    candidate_id: str
    prompts: Mapping[str, str]
    parent_ids: tuple[str, ...] = ()
    origin: str = "seed"
    round_index: int = 0


class Evaluator(Protocol):
    """Runs ``candidate`` on ``tasks`` and returns one result per task, in the order of ``tasks``.

    The implementation enqueues each rollout with ``resources_id=candidate.candidate_id`` (so the agent gets the
    candidate's prompts by name) and ``mode`` as given; it may run them concurrently. A rollout that fails for
    infrastructure reasons should be retried by the store, not scored; a rollout the agent failed scores its reward.
    """

    async def __call__(
        self, candidate: Candidate, tasks: Sequence[TaskInput], *, mode: RolloutMode
    ) -> list[TaskResult]: ...


@dataclass
class Usage:
    """Counts of what an optimization spent.

    Attributes:
        rollouts: task results received from the evaluator (one per rollout).
        optimizer_calls: requests to the optimizer LLM, cache hits included.
        cache_hits: of those, answered from the cache.
        rejected_edits: optimizer replies that gave no usable prompt (empty, duplicate, or placeholders changed).
        wall_s: seconds from start to end.
    """

    rollouts: int = 0
    optimizer_calls: int = 0
    cache_hits: int = 0
    rejected_edits: int = 0
    wall_s: float = 0.0


@dataclass(frozen=True)
class ScoredCandidate:
    """A candidate with its validation scores.

    Attributes:
        candidate: the candidate.
        val_scores: task_id -> reward on the validation tasks it was run on.
        accepted: whether it entered the beam (APO) or the pool (GEPA) at least once.
    """

    candidate: Candidate
    val_scores: Mapping[str, float]
    accepted: bool = True

    @property
    def val_score(self) -> float:
        """Mean validation reward (0.0 with no scores)."""
        return sum(self.val_scores.values()) / len(self.val_scores) if self.val_scores else 0.0


@dataclass
class OptimizationResult:
    """What an optimizer returns.

    Attributes:
        algorithm: ``"apo"`` or ``"gepa"``.
        best: the candidate with the highest mean validation reward (the earliest on ties).
        seed: the starting candidate, for the before/after comparison and the diff.
        candidates: every published candidate in creation order, with its validation scores (empty scores for a
            GEPA child that failed its minibatch check).
        usage: rollouts, optimizer calls, cache hits, wall time.
    """

    algorithm: str
    best: ScoredCandidate
    seed: ScoredCandidate
    candidates: list[ScoredCandidate] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)


def task_id_of(task: TaskInput) -> str:
    """The task's ``task_id`` (a string). Raises ConfigError when it is missing or not a string."""
    task_id = task.get("task_id")
    if not isinstance(task_id, str):
        raise ConfigError(f"every task needs a string 'task_id' for prompt optimization; got keys {sorted(task)}")
    return task_id


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean; 0.0 for an empty sequence."""
    return sum(values) / len(values) if values else 0.0


def format_trace(task: TaskInput, result: TaskResult, *, max_chars: int = 3000, max_message_chars: int = 800) -> str:
    """Render one task result as Markdown for the optimizer LLM.

    Layout: a heading with the task id and reward, the task input as JSON, the messages one per line
    (``[role] content``, tool calls as ``name(arguments)``), the parsed answer and the feedback. Each message is cut
    to ``max_message_chars`` and the whole to ``max_chars`` (cut text ends with ``...``), so a long conversation
    cannot crowd the other traces out of the optimizer's context. The cut falls on the messages: the heading, the
    input, the parsed answer and the feedback are kept whole as long as they fit in ``max_chars`` on their own (the
    feedback is what tells the optimizer what was expected).
    """
    head = [f"### Task {result.task_id} (reward {result.reward:.2f})"]
    shown_input = {key: value for key, value in task.items() if key != "task_id"}
    head.append("Input: " + json.dumps(shown_input, ensure_ascii=False, default=str))
    trace = result.trace
    if trace is None:
        return _clip("\n".join([*head, "(no trace recorded)"]), max_chars)
    body = "\n".join(_clip(_render_message(message), max_message_chars) for message in trace.messages)
    tail = [f"Parsed answer: {trace.answer if trace.answer is not None else '(none)'}"]
    if trace.feedback:
        tail.append(f"Feedback: {trace.feedback}")
    if not body:
        return _clip("\n".join([*head, *tail]), max_chars)
    frame = len("\n".join([*head, *tail])) + 1  # the messages add one more line break
    if frame + 3 > max_chars:  # no room for even a cut message: cut the whole
        return _clip("\n".join([*head, body, *tail]), max_chars)
    return "\n".join([*head, _clip(body, max_chars - frame), *tail])


def format_outcomes(tasks: Sequence[TaskInput], results: Sequence[TaskResult], *, max_feedback_chars: int = 200) -> str:
    """One line per task, in order, for the optimizer LLM to see patterns across a whole batch (the traces show only
    the worst few): ``- <task_id>: reward <r>; answer: <answer or (none)>; <feedback>``; feedback cut to
    ``max_feedback_chars``.

    Example:
        ``- s04: reward 0.00; answer: Atlas; Wrong: the expected choice was Quark, the agent answered Atlas.``

    Raises:
        ValueError: ``tasks`` and ``results`` differ in length.
    """
    if len(tasks) != len(results):
        raise ValueError(f"{len(tasks)} tasks but {len(results)} results")
    lines = []
    for result in results:
        trace = result.trace
        answer = trace.answer if trace is not None and trace.answer is not None else "(none)"
        line = f"- {result.task_id}: reward {result.reward:.2f}; answer: {answer}"
        if trace is not None and trace.feedback:
            line += "; " + _clip(trace.feedback, max_feedback_chars)
        lines.append(line)
    return "\n".join(lines)


def _render_message(message: Message) -> str:
    role = message.get("role", "?")
    content = message.get("content")
    parts = [str(content)] if content else []
    calls = message.get("tool_calls")
    if isinstance(calls, Sequence) and not isinstance(calls, str):
        for call in calls:
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping):
                parts.append(f"calls {function.get('name')}({function.get('arguments')})")
    return f"[{role}] " + " | ".join(parts)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."
