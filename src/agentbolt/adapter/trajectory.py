"""Spans of one attempt -> one :class:`~agentbolt.types.Trajectory` (DESIGN.md, "Adapter and LightningRL", step 1).

Pure: no I/O, no store, no tracer. The rules, in the order they are applied:

1. Only spans of ``attempt_id`` are read; spans of other attempts (a superseded try) are ignored.
2. **Join.** Gateway LLM spans (exact tokens) and tracer LLM spans (structure) are joined into calls, each gateway
   span getting the agent name it was made under (:mod:`agentbolt.adapter.join`, :mod:`agentbolt.adapter.agents`).
   Tracer calls the gateway did not record give no transition; they are counted in ``tracer_only_calls``.
3. **Transitions.** Every ``agentbolt.llm_call`` span, ordered by the store's ``sequence_id`` (never by clocks),
   becomes one :class:`~agentbolt.types.Transition` carrying its ``agent_name``, except a span that

   - has status code ``ERROR`` (context-length errors, backend 5xx: the call failed, nothing was generated),
   - is marked ``agentbolt.llm.trainable = False`` (e.g. served by an ``openai`` backend without token ids),
   - lacks prompt token ids, response token ids or response logprobs, or generated zero tokens;

   these are counted in ``untrainable_calls``. Each transition keeps ``span_id`` and ``finish_reason`` in their
   fields and ``model_version``, ``sequence_id``, ``temperature`` (the request's sampling temperature, when
   recorded) and ``tracer_span_id`` (the deepest joined tracer LLM span, when there is one) in ``metadata``.
4. **agent_match.** With an ``agent_match`` pattern, only transitions whose agent name it selects
   (``re.search``; a call without an agent name is never selected) are kept; the others are counted in
   ``excluded_calls``. The other agents' calls still ran and their rewards still count.
5. **Rewards.** Every ``agentbolt.reward`` span whose value is a reward by the one rule of
   :mod:`agentbolt.types.rewards` (a finite number; a bool as 1.0/0.0; the store refuses the rest), in
   ``sequence_id`` order, is listed in ``intermediate_rewards`` as ``(sequence_id, value)``, named or not. Each is
   also *attached* to the latest trainable LLM call recorded before it
   (:func:`agentbolt.adapter.signals.attach_rewards`), listed in that
   transition's ``metadata["rewards"]`` as ``[sequence_id, value]`` pairs; rewards recorded before the first call
   attach to none. Attachment is computed over every trainable call, before ``agent_match``: a reward that follows
   another agent's call stays with that call and leaves the batch with it.
   **AIR signals.** The tool calls and exceptions recorded in each call's window (after it, before the next
   trainable call) are counted in its ``metadata`` under ``air.tool_calls_ok``, ``air.tool_calls_failed`` and
   ``air.exceptions`` (non-zero counts only; rules in :mod:`agentbolt.adapter.signals`), again before
   ``agent_match``.
6. **Final reward.** ``rollout.final_reward`` when it is set; otherwise the value of the *last unnamed* reward span;
   otherwise ``None``. Named rewards are components or intermediate signals, never the outcome. **When both exist,
   the returned value (``rollout.final_reward``) wins**, even if the agent also emitted a different unnamed reward
   (returned 0.5, emitted 1.0 last: the outcome is 0.5). Normally they agree: when an agent returns a float the
   runner records it both as the attempt's last unnamed reward span and as ``rollout.final_reward``; the returned
   value wins so that a reward span lost in transit (an exporter that dropped it) cannot turn a scored rollout into
   an unscored one. Because ``rollout.final_reward`` belongs to the attempt that ended the rollout, build
   trajectories only for that (the latest) attempt.
7. **Flags** (:class:`~agentbolt.types.TrajectoryFlag`; a flagged trajectory is not trained on):
   ``reward_without_calls`` when there is a final reward but not one trainable call was captured (before
   ``agent_match``); ``no_matching_agent`` when there were trainable calls and ``agent_match`` selected none.
8. **task_id** is ``str(rollout.metadata[task_id_key])``, falling back to ``rollout.rollout_id`` (a group of one).

``Transition.reward`` stays ``None`` here; credit assignment (:mod:`agentbolt.adapter.credit`) sets it from
``final_reward``, the attached rewards and the AIR signals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentbolt import semconv
from agentbolt.adapter.agents import AgentMatch, agent_selected, compile_agent_match
from agentbolt.adapter.join import JoinedCall, join_llm_calls
from agentbolt.adapter.signals import air_counts, attach_rewards
from agentbolt.errors import ConfigError
from agentbolt.types import Rollout, Span, Trajectory, TrajectoryFlag, Transition
from agentbolt.types.rewards import stored_reward
from agentbolt.types.training import REWARDS_ATTACHED

_ERROR_STATUS = "ERROR"


def build_trajectory(
    rollout: Rollout,
    attempt_id: str,
    spans: Sequence[Span],
    *,
    task_id_key: str = "task_id",
    agent_match: AgentMatch = None,
) -> Trajectory:
    """Build the trajectory of one attempt from its spans (rules in the module docstring).

    Args:
        rollout: the rollout the attempt belongs to (its ``final_reward``, ``metadata`` and ``resources_id`` are read).
        attempt_id: the attempt to build; spans of other attempts are ignored.
        spans: the attempt's spans in any order (they are ordered by ``sequence_id`` here).
        task_id_key: the ``rollout.metadata`` key holding the task id used to form GRPO groups.
        agent_match: which agents' calls become transitions: a regular expression (text or compiled) searched in
            each call's agent name; ``None`` (default) keeps every call, named or not.

    Returns:
        A :class:`Trajectory`; its transitions may be empty, and then it is flagged when it has a reward (see
        ``flags``; :attr:`Trajectory.trainable` is False for it).

    Raises:
        ConfigError: ``agent_match`` is not a valid regular expression; or an LLM span has a different number of
            response logprobs than response token ids (a gateway bug: it must record one logprob per generated
            token).
    """
    pattern = compile_agent_match(agent_match)
    own = sorted((s for s in spans if s.attempt_id == attempt_id), key=lambda s: s.sequence_id)
    join = join_llm_calls(own)

    trainable: list[Transition] = []
    untrainable_calls = 0
    for call in join.calls:
        transition = _transition_from_call(call)
        if transition is None:
            untrainable_calls += 1
        else:
            trainable.append(transition)
    trainable_calls = len(trainable)

    intermediate_rewards: list[tuple[int, float]] = []
    for span in own:
        if span.name == semconv.SPAN_REWARD:
            value = _reward_value(span.attributes.get(semconv.REWARD_VALUE))
            if value is not None:
                intermediate_rewards.append((span.sequence_id, value))

    call_sequence_ids = [int(t.metadata["sequence_id"]) for t in trainable]
    attached, _ = attach_rewards(call_sequence_ids, intermediate_rewards)
    for transition, rewards, counts in zip(trainable, attached, air_counts(call_sequence_ids, own), strict=True):
        if rewards:
            transition.metadata[REWARDS_ATTACHED] = [[sequence_id, value] for sequence_id, value in rewards]
        transition.metadata.update(counts)
    transitions = [t for t in trainable if agent_selected(t.agent_name, pattern)]

    final_reward = rollout.final_reward if rollout.final_reward is not None else last_reward(own)
    flags: list[TrajectoryFlag] = []
    if trainable_calls == 0 and final_reward is not None:
        flags.append(TrajectoryFlag.REWARD_WITHOUT_CALLS)
    elif trainable_calls > 0 and not transitions:
        flags.append(TrajectoryFlag.NO_MATCHING_AGENT)
    task_id = rollout.metadata.get(task_id_key)
    return Trajectory(
        rollout_id=rollout.rollout_id,
        attempt_id=attempt_id,
        task_id=str(task_id) if task_id is not None else rollout.rollout_id,
        resources_id=rollout.resources_id,
        transitions=transitions,
        final_reward=final_reward,
        intermediate_rewards=intermediate_rewards,
        flags=flags,
        excluded_calls=trainable_calls - len(transitions),
        untrainable_calls=untrainable_calls,
        tracer_only_calls=len(join.tracer_only),
    )


def _transition_from_call(call: JoinedCall) -> Transition | None:
    """A joined call -> a transition named after its agent, or ``None`` when its gateway span cannot be trained on."""
    transition = _transition_from_span(call.gateway)
    if transition is None:
        return None
    transition.agent_name = call.agent_name
    if call.tracer_spans:
        transition.metadata["tracer_span_id"] = call.tracer_spans[0].span_id
    return transition


def _transition_from_span(span: Span) -> Transition | None:
    """One LLM span -> a transition, or ``None`` when the span cannot be trained on (see the module docstring)."""
    if span.status.code == _ERROR_STATUS:
        return None
    attrs = span.attributes
    if attrs.get(semconv.LLM_TRAINABLE) is False:
        return None
    prompt_ids = attrs.get(semconv.LLM_PROMPT_TOKEN_IDS)
    response_ids = attrs.get(semconv.LLM_RESPONSE_TOKEN_IDS)
    logprobs = attrs.get(semconv.LLM_RESPONSE_LOGPROBS)
    if not prompt_ids or not response_ids or logprobs is None:
        return None
    if len(logprobs) != len(response_ids):
        raise ConfigError(
            f"LLM span {span.span_id} (sequence_id {span.sequence_id}) has {len(logprobs)} response logprobs for "
            f"{len(response_ids)} response token ids; the gateway must record one logprob per generated token"
        )
    metadata: dict[str, Any] = {"sequence_id": span.sequence_id}
    model_version = attrs.get(semconv.LLM_MODEL_VERSION)
    if model_version is not None:
        metadata["model_version"] = model_version
    temperature = attrs.get(semconv.GEN_AI_REQUEST_TEMPERATURE)
    if isinstance(temperature, int | float) and not isinstance(temperature, bool):
        metadata["temperature"] = float(temperature)
    return Transition(
        prompt_token_ids=[int(t) for t in prompt_ids],
        response_token_ids=[int(t) for t in response_ids],
        sampling_logprobs=[float(x) for x in logprobs],
        finish_reason=_finish_reason(attrs.get(semconv.GEN_AI_RESPONSE_FINISH_REASON)),
        span_id=span.span_id,
        metadata=metadata,
    )


def _finish_reason(raw: object) -> str | None:
    """``gen_ai.response.finish_reasons`` is a string array in the OTel spec; accept a bare string too."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list | tuple) and raw:
        return str(raw[0])
    return None


def last_reward(spans: Sequence[Span], name: str | None = None) -> float | None:
    """Value of the last valid reward span called ``name`` (``None``: the last *unnamed* one), in list order.

    This is the one rule for reading rewards back: the final reward of an attempt is its last unnamed reward, and
    a named component (e.g. ``correct``) is its last reward of that name. ``None`` when there is none.
    """
    for span in reversed(spans):
        if span.name == semconv.SPAN_REWARD and span.attributes.get(semconv.REWARD_NAME) == name:
            value = _reward_value(span.attributes.get(semconv.REWARD_VALUE))
            if value is not None:
                return value
    return None


CORRECT_AT = 1.0
"""The default success threshold (``grpo.success_threshold``): a rollout counts as a success when its accuracy
reward is at least this (unit: reward)."""


def accuracy_reward(spans: Sequence[Span], name: str | None, final_reward: float | None = None) -> float | None:
    """The reward that scores one attempt for accuracy: the last reward called ``name`` when the attempt recorded
    one, else its final reward (``final_reward``, the rollout's, when given; else the last unnamed reward span, the
    rule of :func:`build_trajectory`); ``None`` when it has neither. ``name`` ``None`` or ``""``: the final reward.

    An agent that emits a component such as ``correct`` is scored by it; an agent that only returns its reward
    (the README's style) is scored by that reward. Count the attempt a success when the value is at least the
    threshold, as :func:`is_correct` does. Whether the named reward was there at all is
    :func:`has_named_reward`: an evaluation in which no rollout recorded it reports so instead of falling back in
    silence.
    """
    value = last_reward(spans, name) if name else None
    if value is not None:
        return value
    return final_reward if final_reward is not None else last_reward(spans, None)


def has_named_reward(spans: Sequence[Span], name: str | None) -> bool:
    """Whether the attempt recorded a valid reward called ``name`` (``True`` when ``name`` is ``None`` or ``""``:
    the final reward is read then, and nothing named is expected)."""
    return not name or last_reward(spans, name) is not None


def is_correct(value: float | None, threshold: float = CORRECT_AT) -> bool:
    """``True`` when an accuracy reward (:func:`accuracy_reward`) is at least ``threshold``; ``None`` (no reward,
    or a rollout that did not succeed) is not correct."""
    return value is not None and value >= threshold


def describe_success(name: str | None, threshold: float = CORRECT_AT) -> str:
    """The success rule in words, as the job's header line shows it: ``final reward >= 1.0`` or
    ``reward 'correct' >= 1.0``."""
    what = f"reward {name!r}" if name else "final reward"
    return f"{what} >= {float(threshold)!r}"


def _reward_value(raw: object) -> float | None:
    """A reward span's value as a float by the one reward rule (:func:`agentbolt.types.rewards.stored_reward`), or
    ``None`` when it is not a reward (only spans stored before the store enforced the rule can hold one)."""
    return stored_reward(raw)
