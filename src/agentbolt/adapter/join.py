"""Joining the two capture paths of one attempt: gateway LLM spans (exact tokens) and tracer LLM spans (structure).
Pure: no I/O.

Both paths can record the same LLM call: the gateway records each call it serves as ``agentbolt.llm_call`` spans
(one per choice, sharing ``gen_ai.response.id``), and an instrumented client or framework records it as a *tracer
LLM span* (OpenInference kind ``LLM``, or an OpenTelemetry GenAI span with ``gen_ai.operation.name``). The join
makes each call one unit, so that it becomes at most one transition per choice, named after the agent it was made
under. The rules, in order:

1. **Tracer calls.** Tracer LLM spans nested in one another (a framework's LLM span and, under it, the client's)
   describe one call: each tracer LLM span belongs to the call of its outermost tracer LLM ancestor (itself when it
   has none). Calls are ordered by their first ``sequence_id``.
2. **Gateway requests.** Gateway spans sharing ``gen_ai.response.id`` are one request (its ``n`` choices); a span
   without an id is a request of its own. Requests are ordered by their first ``sequence_id``.
3. **Join by response id.** A tracer call whose spans carry a gateway response id (``gen_ai.response.id``, or any
   ``"id"`` string inside the JSON of ``output.value``: the openai instrumentor records the whole response there)
   is joined to that request. Several calls may carry one id (the same call recorded by two instrumentors whose
   spans do not nest, e.g. LangChain's and the openai client's): all are joined to it.
4. **Join by order and messages.** Each call still unjoined (no id: the call raised, or the framework does not
   record ids), in order, is joined to the first unjoined request, in order, whose request messages equal the
   call's (:func:`canonical_messages`: role, text content and tool calls by function name and arguments; an
   assistant message without a role that holds tool calls counts as ``assistant``). So the k-th call with some
   messages pairs with the k-th request with the same messages.
5. **Agent name** of each gateway span (every choice of its request): when joined, the first name found walking up
   from the tracer spans joined to it, deepest span first (:func:`agentbolt.adapter.agents.agent_name_of`); when not
   joined, or when that finds none, the walk from the gateway span itself (its ``agentbolt.agent.name``, recorded
   from the ``x-agentbolt-agent`` header, then its parent, recorded from a ``traceparent`` header).
6. **Tracer-only calls.** Calls left unjoined were not recorded by the gateway (made to another endpoint, or
   lost): they give no transition and are reported in :attr:`CallJoin.tracer_only`.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentbolt import semconv
from agentbolt.adapter.agents import agent_name_of
from agentbolt.inference.chat_format import content_text
from agentbolt.types import Span

_GEN_AI_LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
_MAX_ID_DEPTH = 8
_MAX_IDS = 64
_FLAT_MESSAGE = re.compile(r"^" + re.escape(semconv.OI_LLM_INPUT_MESSAGES) + r"\.(\d+)\.message\.(.+)$")
# AutoGen's instrumentor records one "function" message per tool turn, its K results as JSON objects in
# ``llm.input_messages.<i>.function.<k>`` ({"name", "content", "call_id", "is_error"}); the wire has K tool messages.
_FLAT_FUNCTION_RESULT = re.compile(r"^" + re.escape(semconv.OI_LLM_INPUT_MESSAGES) + r"\.(\d+)\.function\.(\d+)$")
_ROLE_ALIASES = {"developer": "system", "function": "tool"}
"""Roles that name the same thing on the wire (OpenAI's ``developer`` is the ``system`` message of older APIs)."""
_FLAT_TOOL_CALL = re.compile(r"^tool_calls\.(\d+)\.tool_call\.function\.(name|arguments)$")
_FLAT_CONTENT_TEXT = re.compile(r"^contents\.(\d+)\.message_content\.text$")

CanonicalToolCall = tuple[str, str]
"""``(function name, arguments as canonical JSON text)``."""
CanonicalMessage = tuple[str, str, tuple[CanonicalToolCall, ...]]
"""``(role, text content, tool calls)``."""


@dataclass(frozen=True)
class TracerCall:
    """One LLM call as the tracer recorded it: one or more nested tracer LLM spans.

    Attributes:
        spans: the call's tracer LLM spans, deepest first (the outermost one last).
    """

    spans: tuple[Span, ...]

    @property
    def first_sequence_id(self) -> int:
        """The smallest store sequence id of its spans (its place in the attempt)."""
        return min(s.sequence_id for s in self.spans)


@dataclass(frozen=True)
class JoinedCall:
    """One gateway span (one choice of a call) and what the tracer knows about the call.

    Attributes:
        gateway: the gateway ``agentbolt.llm_call`` span.
        tracer_spans: the tracer LLM spans of the call, deepest first (empty when the tracer did not record it).
        agent_name: the agent the call was made under (rule 5 of the module docstring), or ``None``.
    """

    gateway: Span
    tracer_spans: tuple[Span, ...]
    agent_name: str | None


@dataclass(frozen=True)
class CallJoin:
    """The join of one attempt's LLM spans.

    Attributes:
        calls: one entry per gateway span, in store sequence order.
        tracer_only: tracer calls no gateway span was joined to, in order.
    """

    calls: list[JoinedCall]
    tracer_only: list[TracerCall]


def is_gateway_llm_span(span: Span) -> bool:
    """A span recorded by agentbolt's gateway (``agentbolt.llm_call``)."""
    return span.name == semconv.SPAN_LLM_CALL


def is_tracer_llm_span(span: Span) -> bool:
    """An LLM span recorded on the agent side: OpenInference kind ``LLM``, or a GenAI ``chat``/``text_completion``
    span; never a gateway span."""
    if is_gateway_llm_span(span):
        return False
    if span.attributes.get(semconv.OI_SPAN_KIND) == semconv.OI_SPAN_KIND_LLM:
        return True
    return span.attributes.get(semconv.GEN_AI_OPERATION_NAME) in _GEN_AI_LLM_OPERATIONS


def response_ids(span: Span) -> list[str]:
    """Response ids a tracer LLM span carries: ``gen_ai.response.id``, then every ``"id"`` string in the JSON of
    ``output.value`` (depth-first, at most 64, nesting depth at most 8). Ids that are not a gateway's never match."""
    found: list[str] = []
    direct = span.attributes.get(semconv.GEN_AI_RESPONSE_ID)
    if isinstance(direct, str) and direct:
        found.append(direct)
    raw = span.attributes.get(semconv.OI_OUTPUT_VALUE)
    if isinstance(raw, str) and raw[:1] in ("{", "["):
        with contextlib.suppress(ValueError):
            _collect_ids(json.loads(raw), found, 0)
    return list(dict.fromkeys(found))


def _collect_ids(value: Any, found: list[str], depth: int) -> None:
    if depth > _MAX_ID_DEPTH or len(found) >= _MAX_IDS:
        return
    if isinstance(value, Mapping):
        own = value.get("id")
        if isinstance(own, str) and own:
            found.append(own)
        for child in value.values():
            _collect_ids(child, found, depth + 1)
    elif isinstance(value, list):
        for child in value:
            _collect_ids(child, found, depth + 1)


def canonical_messages(messages: Sequence[Any]) -> tuple[CanonicalMessage, ...]:
    """Chat messages reduced to what identifies a request: per message, the role (``assistant`` when absent and the
    message holds tool calls, else ``""``), the text content (``None`` and absent -> ``""``, a list of parts -> the
    concatenation of its text parts) and the tool calls as ``(function name, arguments)`` with the arguments as
    canonical JSON when they parse. Ids, names and other keys are ignored. A non-dict message counts as empty."""
    return tuple(_canonical_message(m if isinstance(m, Mapping) else {}) for m in messages)


def _canonical_message(message: Mapping[str, Any]) -> CanonicalMessage:
    calls = tuple(_canonical_tool_call(c) for c in (message.get("tool_calls") or []) if isinstance(c, Mapping))
    role = message.get("role")
    role_text = str(role) if role else ("assistant" if calls else "")
    return _ROLE_ALIASES.get(role_text, role_text), content_text(message.get("content")), calls


def _canonical_tool_call(call: Mapping[str, Any]) -> CanonicalToolCall:
    function = call.get("function")
    function = function if isinstance(function, Mapping) else {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return str(function.get("name") or ""), arguments
    if arguments is None:
        arguments = {}
    return str(function.get("name") or ""), json.dumps(arguments, sort_keys=True, separators=(",", ":"))


def tracer_request_messages(span: Span) -> tuple[CanonicalMessage, ...] | None:
    """The request messages of a tracer LLM span, canonical: from the flattened OpenInference
    ``llm.input_messages.<i>.message.*`` attributes, else from an ``input.value`` JSON that is a list of messages or
    an object with a ``messages`` list; ``None`` when the span records neither."""
    flat: dict[int, dict[str, Any]] = {}
    results: dict[int, dict[int, Any]] = {}
    for key, value in span.attributes.items():
        match = _FLAT_MESSAGE.match(key)
        if match is not None:
            _set_flat_field(flat.setdefault(int(match.group(1)), {}), match.group(2), value)
            continue
        result = _FLAT_FUNCTION_RESULT.match(key)
        if result is not None:
            results.setdefault(int(result.group(1)), {})[int(result.group(2))] = value
    if flat:
        messages: list[dict[str, Any]] = []
        for i in range(max(flat) + 1):
            if i in results:  # one recorded message holding K tool results: K tool messages on the wire
                messages += [{"role": "tool", "content": _result_content(results[i][k])} for k in sorted(results[i])]
            else:
                messages.append(_flat_message(flat.get(i, {})))
        return canonical_messages(messages)
    raw = span.attributes.get(semconv.OI_INPUT_VALUE)
    if not isinstance(raw, str) or raw[:1] not in ("{", "["):
        return None
    try:
        decoded = json.loads(raw)
    except ValueError:
        return None
    if isinstance(decoded, Mapping):
        decoded = decoded.get("messages")
    if isinstance(decoded, list) and all(isinstance(m, Mapping) for m in decoded):
        return canonical_messages(decoded)
    return None


def _result_content(value: Any) -> str:
    """The content of one AutoGen tool result recorded as JSON text (``{"content": ...}``), else the text itself."""
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            return value
        if isinstance(decoded, Mapping):
            return content_text(decoded.get("content"))
        return value
    if isinstance(value, Mapping):
        return content_text(value.get("content"))
    return str(value)


def _set_flat_field(message: dict[str, Any], field: str, value: Any) -> None:
    if field in ("role", "content"):
        message[field] = value
        return
    call = _FLAT_TOOL_CALL.match(field)
    if call is not None:
        message.setdefault("tool_calls", {}).setdefault(int(call.group(1)), {})[call.group(2)] = value
        return
    part = _FLAT_CONTENT_TEXT.match(field)
    if part is not None:
        message.setdefault("parts", {})[int(part.group(1))] = value


def _flat_message(fields: Mapping[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {}
    if "role" in fields:
        message["role"] = fields["role"]
    if "content" in fields:
        message["content"] = fields["content"]
    elif "parts" in fields:
        parts = fields["parts"]
        message["content"] = [{"type": "text", "text": parts[j]} for j in sorted(parts)]
    if "tool_calls" in fields:
        calls = fields["tool_calls"]
        message["tool_calls"] = [{"function": calls[j]} for j in sorted(calls)]
    return message


def _gateway_request_messages(span: Span) -> tuple[CanonicalMessage, ...] | None:
    raw = span.attributes.get(semconv.LLM_REQUEST_MESSAGES)
    return canonical_messages(raw) if isinstance(raw, list) else None


def _depth(span: Span, by_id: Mapping[str, Span]) -> int:
    depth, seen, current = 0, {span.span_id}, span
    while current.parent_id and current.parent_id in by_id and current.parent_id not in seen:
        current = by_id[current.parent_id]
        seen.add(current.span_id)
        depth += 1
    return depth


def _outermost_llm_ancestor(span: Span, by_id: Mapping[str, Span]) -> Span:
    outermost, seen, current = span, {span.span_id}, span
    while current.parent_id and current.parent_id in by_id and current.parent_id not in seen:
        current = by_id[current.parent_id]
        seen.add(current.span_id)
        if is_tracer_llm_span(current):
            outermost = current
    return outermost


def tracer_calls(spans: Sequence[Span]) -> list[TracerCall]:
    """The tracer calls of one attempt's spans (rule 1 of the module docstring), in order."""
    by_id = {s.span_id: s for s in spans}
    groups: dict[str, list[Span]] = {}
    for span in spans:
        if is_tracer_llm_span(span):
            groups.setdefault(_outermost_llm_ancestor(span, by_id).span_id, []).append(span)
    calls = [
        TracerCall(tuple(sorted(members, key=lambda s: (-_depth(s, by_id), s.sequence_id))))
        for members in groups.values()
    ]
    return sorted(calls, key=lambda c: c.first_sequence_id)


def join_llm_calls(spans: Sequence[Span]) -> CallJoin:
    """Join the gateway and tracer LLM spans of one attempt (rules in the module docstring).

    Args:
        spans: the spans of one attempt, any order.

    Returns:
        The joined calls (one per gateway span, in sequence order) and the tracer-only calls.
    """
    ordered = sorted(spans, key=lambda s: s.sequence_id)
    by_id = {s.span_id: s for s in ordered}

    requests: dict[str, list[Span]] = {}
    for span in ordered:
        if is_gateway_llm_span(span):
            response_id = span.attributes.get(semconv.GEN_AI_RESPONSE_ID)
            key = response_id if isinstance(response_id, str) and response_id else f"span:{span.span_id}"
            requests.setdefault(key, []).append(span)
    request_keys = list(requests)  # in order of first sequence id (dicts keep insertion order)

    joined: dict[str, list[TracerCall]] = {}  # request key -> the tracer calls joined to it
    unjoined: list[TracerCall] = []
    for call in tracer_calls(ordered):
        key = next((i for s in call.spans for i in response_ids(s) if i in requests), None)
        if key is None:
            unjoined.append(call)
        else:  # several calls with one id: the same call recorded by two instrumentors that do not nest
            joined.setdefault(key, []).append(call)

    tracer_only: list[TracerCall] = []
    request_messages: dict[str, tuple[CanonicalMessage, ...] | None] = {}
    for call in unjoined:
        wanted = {m for m in (tracer_request_messages(s) for s in call.spans) if m is not None}
        key = None
        for candidate in request_keys:
            if candidate in joined:
                continue
            if candidate not in request_messages:
                request_messages[candidate] = _gateway_request_messages(requests[candidate][0])
            if request_messages[candidate] in wanted:
                key = candidate
                break
        if key is None:
            tracer_only.append(call)
        else:
            joined[key] = [call]

    out: list[JoinedCall] = []
    for key in request_keys:
        tracer_spans = tuple(
            sorted(
                (s for call in joined.get(key, []) for s in call.spans),
                key=lambda s: (-_depth(s, by_id), s.sequence_id),
            )
        )
        name = next((n for n in (agent_name_of(s, by_id) for s in tracer_spans) if n is not None), None)
        for span in requests[key]:
            own = name if name is not None else agent_name_of(span, by_id)
            out.append(JoinedCall(gateway=span, tracer_spans=tracer_spans, agent_name=own))
    out.sort(key=lambda c: c.gateway.sequence_id)
    return CallJoin(calls=out, tracer_only=tracer_only)
