"""``agentbolt inspect ROLLOUT_ID``: one rollout, its attempts, and one attempt's span tree, in the terminal (rich) or
as JSON.

The span tree nests spans by ``parent_id`` (a span whose parent is not among the attempt's spans is a root) and
orders siblings by the store's ``sequence_id``. Each node is labelled by what the span is: a gateway LLM call (model,
tokens in/out, the start of the reply or its tool calls, finish reason or error), an LLM call seen by the tracer,
a tool call, a reward (name, value), an exception (type, message), an agent scope, a message; with its duration.
The store keeps each attempt's current status, not every state it went through: the rollout's history is its
attempts in order (each with its status, worker, times and error).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from agentbolt import semconv
from agentbolt.adapter.join import is_gateway_llm_span, is_tracer_llm_span
from agentbolt.errors import ConfigError
from agentbolt.store.base import LightningStore
from agentbolt.types import Attempt, Rollout, Span

PREVIEW_CHARS = 80
"""How much of a reply, message or input a node shows."""


@dataclass
class SpanNode:
    """One span of the tree: its label and kind (``llm``, ``llm_tracer``, ``tool``, ``reward``, ``exception``,
    ``agent``, ``message``, ``span``), duration in seconds (``None`` while open), and children."""

    span: Span
    kind: str
    label: str
    duration_s: float | None
    children: list[SpanNode] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The node, its span's ids and name, and its children, as JSON-compatible data."""
        return {
            "span_id": self.span.span_id,
            "sequence_id": self.span.sequence_id,
            "name": self.span.name,
            "kind": self.kind,
            "label": self.label,
            "status": self.span.status.code,
            "duration_s": self.duration_s,
            "children": [child.to_json() for child in self.children],
        }


@dataclass
class Inspection:
    """What ``agentbolt inspect`` shows: the rollout, all its attempts, the chosen attempt and its span tree."""

    rollout: Rollout
    attempts: list[Attempt]
    attempt: Attempt | None
    spans: list[Span]
    roots: list[SpanNode]

    def to_json(self) -> dict[str, Any]:
        """Everything, JSON-compatible: ``rollout``, ``attempts``, ``attempt_id``, ``tree`` and the raw ``spans``."""
        return {
            "rollout": self.rollout.model_dump(mode="json"),
            "attempts": [a.model_dump(mode="json") for a in self.attempts],
            "attempt_id": self.attempt.attempt_id if self.attempt is not None else None,
            "tree": [root.to_json() for root in self.roots],
            "spans": [s.model_dump(mode="json") for s in self.spans],
        }


def _preview(value: Any, limit: int = PREVIEW_CHARS) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _tool_calls(message: Mapping[str, Any]) -> str:
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        return ""
    parts = []
    for call in calls:
        function = call.get("function", {}) if isinstance(call, Mapping) else {}
        parts.append(f"{function.get('name', '?')}({_preview(function.get('arguments', ''), 40)})")
    return "tool calls " + ", ".join(parts)


def _llm_label(span: Span) -> str:
    a = span.attributes
    model = a.get(semconv.GEN_AI_RESPONSE_MODEL) or a.get(semconv.GEN_AI_REQUEST_MODEL) or "?"
    label = f"LLM call {model}: {a.get(semconv.GEN_AI_USAGE_INPUT_TOKENS, '?')} tokens in"
    label += f", {a.get(semconv.GEN_AI_USAGE_OUTPUT_TOKENS, '?')} out"
    finish = a.get(semconv.GEN_AI_RESPONSE_FINISH_REASON)
    if isinstance(finish, list) and finish:
        label += f", finish {finish[0]}"
    if a.get(semconv.LLM_ERROR) is not None:
        return f"{label}; failed: {_preview(a[semconv.LLM_ERROR])}"
    message = a.get(semconv.LLM_RESPONSE_MESSAGE)
    reply = _tool_calls(message) if isinstance(message, Mapping) else ""
    text = message.get("content") if isinstance(message, Mapping) else a.get(semconv.LLM_RESPONSE_TEXT)
    if text:
        reply = f"{_preview(text)!r}" + (f"; {reply}" if reply else "")
    if a.get(semconv.LLM_TRAINABLE) is False:
        label += f" (not trainable: {a.get(semconv.LLM_NOT_TRAINABLE_REASON, '?')})"
    return f"{label}: {reply}" if reply else label


def _is_tool(span: Span) -> bool:
    a = span.attributes
    return a.get(semconv.OI_SPAN_KIND) == "TOOL" or a.get(semconv.GEN_AI_OPERATION_NAME) == "execute_tool"


def describe(span: Span) -> tuple[str, str]:
    """``(kind, label)`` of one span (see :class:`SpanNode`)."""
    a = span.attributes
    if is_gateway_llm_span(span):
        return "llm", _llm_label(span)
    if span.name == semconv.SPAN_REWARD:
        return "reward", f"reward {a.get(semconv.REWARD_NAME) or '(final)'} = {a.get(semconv.REWARD_VALUE)}"
    if span.name == semconv.SPAN_EXCEPTION:
        return (
            "exception",
            f"exception {a.get(semconv.EXCEPTION_TYPE, '?')}: {_preview(a.get(semconv.EXCEPTION_MESSAGE, ''))}",
        )
    if span.name == semconv.SPAN_AGENT:
        return "agent", f"agent {a.get(semconv.AGENT_NAME, '?')}"
    if span.name == semconv.SPAN_MESSAGE:
        return "message", f"message {_preview(a.get(semconv.MESSAGE_TEXT, ''))!r}"
    if is_tracer_llm_span(span):
        return "llm_tracer", f"LLM (tracer) {span.name}"
    if _is_tool(span):
        label = f"tool {a.get('tool.name') or a.get('gen_ai.tool.name') or span.name}"
        if a.get(semconv.OI_INPUT_VALUE) is not None:
            label += f"({_preview(a[semconv.OI_INPUT_VALUE], 40)})"
        if a.get(semconv.OI_OUTPUT_VALUE) is not None:
            label += f" -> {_preview(a[semconv.OI_OUTPUT_VALUE], 60)}"
        return "tool", label
    if span.name == semconv.SPAN_OPERATION:
        return "span", f"operation {a.get(semconv.OPERATION_NAME, '?')}"
    return "span", span.name


def span_tree(spans: Sequence[Span]) -> list[SpanNode]:
    """The spans as a forest (module docstring), roots and siblings in ``sequence_id`` order."""
    ordered = sorted(spans, key=lambda s: s.sequence_id)
    nodes: dict[str, SpanNode] = {}
    for span in ordered:
        kind, label = describe(span)
        duration = span.end_time - span.start_time if span.end_time is not None else None
        nodes[span.span_id] = SpanNode(span, kind, label, duration)
    roots: list[SpanNode] = []
    for span in ordered:
        parent = nodes.get(span.parent_id) if span.parent_id is not None else None
        (parent.children if parent is not None and parent.span is not span else roots).append(nodes[span.span_id])
    return roots


async def load_inspection(store: LightningStore, rollout_id: str, *, attempt_sequence: int | None = None) -> Inspection:
    """Read one rollout, its attempts, and the spans of attempt ``attempt_sequence`` (its ``sequence_id``; ``None``:
    the latest).

    Raises:
        NotFoundError: no such rollout.
        ConfigError: no attempt with that number.
    """
    rollout = await store.get_rollout(rollout_id)
    attempts = await store.query_attempts(rollout_id)
    if attempt_sequence is None:
        attempt = attempts[-1] if attempts else None
    else:
        chosen = [a for a in attempts if a.sequence_id == attempt_sequence]
        if not chosen:
            have = ", ".join(str(a.sequence_id) for a in attempts) or "none: it never ran"
            raise ConfigError(f"rollout {rollout_id} has no attempt {attempt_sequence} (attempts: {have})")
        attempt = chosen[0]
    spans = [] if attempt is None else list(await store.query_spans(rollout_id, attempt.attempt_id))
    return Inspection(rollout, attempts, attempt, spans, span_tree(spans))


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "open"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


TRACEBACK_LINES = 40
"""How many of a failed attempt's traceback lines ``inspect`` shows (the last ones: where it was raised)."""

_STYLES = {"llm": "cyan", "llm_tracer": "cyan", "tool": "magenta", "reward": "green", "exception": "red"}


def _add(tree: Tree, node: SpanNode) -> None:
    style = _STYLES.get(node.kind, "")
    text = escape(node.label)
    if node.span.status.code == "ERROR":
        text += " [red](ERROR)[/]"
    branch = tree.add(
        f"[{style}]{text}[/] [dim]{_duration(node.duration_s)}[/]"
        if style
        else f"{text} [dim]{_duration(node.duration_s)}[/]"
    )
    for child in node.children:
        _add(branch, child)


def render(inspection: Inspection) -> RenderableType:
    """The rollout summary, the attempts table and the span tree, for a rich console."""
    r = inspection.rollout
    head = Table.grid(padding=(0, 2))
    head.add_row("rollout", f"[bold]{r.rollout_id}[/]")
    head.add_row("status", r.status.value)
    head.add_row("mode", r.mode.value)
    head.add_row("resources", r.resources_id or "(latest at claim)")
    head.add_row("final reward", "-" if r.final_reward is None else f"{r.final_reward:g}")
    head.add_row("input", escape(_preview(r.input, 120)))
    if r.metadata:
        head.add_row("metadata", escape(_preview(r.metadata, 120)))
    attempts = Table(title="attempts", title_justify="left")
    for column in ("#", "attempt", "status", "worker", "resources", "duration", "error"):
        attempts.add_column(column)
    for a in inspection.attempts:
        error = f"{a.error.get('type', '?')}: {_preview(a.error.get('message', ''))}" if a.error else ""
        duration = _duration(a.end_time - a.start_time if a.end_time is not None else None)
        attempts.add_row(
            str(a.sequence_id),
            a.attempt_id,
            a.status.value,
            a.worker_id or "",
            a.resources_id or "",
            duration,
            escape(error),
        )
    if inspection.attempt is None:
        return Group(head, attempts, "no attempt: the rollout never ran")
    a = inspection.attempt
    tree = Tree(f"[bold]attempt {a.sequence_id}[/] {a.attempt_id} ({a.status.value}), {len(inspection.spans)} spans")
    for root in inspection.roots:
        _add(tree, root)
    if not inspection.roots:
        tree.add("[dim](no spans)[/]")
    parts: list[RenderableType] = [head, attempts, tree]
    trace = (a.error or {}).get("traceback")
    if isinstance(trace, str) and trace.strip():
        lines = trace.rstrip().splitlines()
        cut = len(lines) - TRACEBACK_LINES
        shown = lines[-TRACEBACK_LINES:] if cut > 0 else lines
        title = f"traceback of attempt {a.sequence_id}" + (
            f" (its last {TRACEBACK_LINES} lines; --json has all)" if cut > 0 else ""
        )
        parts += [Text(title, style="bold red"), Text("\n".join(shown))]
    return Group(*parts)
