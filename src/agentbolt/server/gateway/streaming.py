"""``stream: true``: the answer as server-sent events, recorded whole once generation ends.

Wire format: ``Content-Type: text/event-stream``; which events, in which shape, is the protocol's
:class:`~agentbolt.server.gateway.calls.StreamEncoder` (Chat Completions chunks, Completions chunks, Responses
events, Anthropic Messages events). The session calls it in order: ``begin``; per choice ``choice_begin``, ``text``
for each content delta as the backend generates it, ``choice_end``; then ``end`` (or ``error`` when generation
failed after the stream started).

Tool calls are written in the text (``<tool_call>`` tags or a bare JSON message), so text that may be part of one
is held back (:class:`ContentHoldBack`) and the calls are sent once the text is complete.

Generation does not belong to the HTTP request: a :class:`StreamSession` runs in its own task, reads the backend's
:class:`~agentbolt.inference.base.GenerationStream` of every choice, and queues the events the response sends.
When generation ends it records one span per choice (:mod:`agentbolt.server.gateway.recording`), then sends the
usage and ``[DONE]``, so a client that has read ``[DONE]`` finds the spans in the store. If the client goes away
first, the session cancels generation, and records what was generated with ``agentbolt.llm.client_disconnected``
and ``agentbolt.llm.trainable = False``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from agentbolt.inference.base import GenerationResult, GenerationStream
from agentbolt.server.gateway.calls import CallSpec, ChoiceOutput, StreamEncoder
from agentbolt.server.gateway.openai_format import (
    choice_output,
    error_info,
    message_body,
    offered_tool_names,
)
from agentbolt.server.gateway.recording import REASON_NOT_DELIVERED, CallRecorder
from agentbolt.server.gateway.toolcalls import ToolCall
from agentbolt.types import Span

logger = logging.getLogger(__name__)

_TAG = "<tool_call>"
_BARE_STARTS = ("{", "[", "`")
"""A message starting with one of these may be a bare JSON tool call: it is held back whole."""

_SESSIONS: set[asyncio.Task[None]] = set()
"""Running session tasks (a strong reference keeps them alive after the response is gone)."""


class ContentHoldBack:
    """How much of the text generated so far may already be sent as ``content``.

    Held back: leading and trailing whitespace (the parser strips it around tool calls); everything from the first
    ``<tool_call>`` on, and a trailing piece that could be its beginning (``<tool``); and the whole message while
    it starts with ``{``, ``[`` or a backquote (it may be a bare JSON call); nothing when the request offered no
    tools (``tools_offered=False``: no call will be parsed). What is sent is always a prefix of
    the text. :meth:`finish` gives what remains to send once the message is parsed, so that the sent pieces add
    up to the content returned by a non-streamed call (surrounding whitespace aside).
    """

    def __init__(self, *, tools_offered: bool = True) -> None:
        self._text = ""
        self._sent = 0
        self._hold = tools_offered

    def feed(self, delta: str) -> str:
        """Add ``delta`` to the text; return the content that may be sent now (possibly ``""``)."""
        self._text += delta
        end = self._safe_end()
        if end <= self._sent:
            return ""
        out = self._text[self._sent : end]
        self._sent = end
        return out

    def finish(self, final_text: str, content: str | None, tool_calls: list[ToolCall]) -> tuple[str, str | None]:
        """The rest to send and the message content the client has then received in all.

        Args:
            final_text: the whole generated text (the backend's result).
            content / tool_calls: the message parsed from it.

        Returns:
            ``(rest, received)``: ``rest`` to send as a last content delta (may be ``""``); ``received`` is the
            concatenation of everything sent, ``None`` when empty.
        """
        sent = self._text[: self._sent]
        target = final_text if not tool_calls else (content or "")
        head = sent if not tool_calls else sent.lstrip()
        if target.startswith(head):
            rest = target[len(head) :]
        else:  # cannot happen with prefix-stable decoding; what was sent cannot be taken back
            logger.warning("streamed content %r is not a prefix of the final content %r", sent, target)
            rest = ""
        received = sent + rest
        return rest, (received or None)

    def _safe_end(self) -> int:
        text = self._text
        if not self._hold:  # no tools offered: the text is content as it comes
            return len(text)
        stripped = text.lstrip()
        if not stripped:
            return self._sent
        if self._sent == 0 and stripped.startswith(_BARE_STARTS):
            return 0
        tag_at = text.find(_TAG)
        end = tag_at if tag_at >= 0 else len(text) - _partial_tag_length(text)
        end = len(text[:end].rstrip())
        return max(end, self._sent)


def _partial_tag_length(text: str) -> int:
    """Length of the longest end of ``text`` that is a proper beginning of ``<tool_call>``."""
    for length in range(min(len(_TAG) - 1, len(text)), 0, -1):
        if text.endswith(_TAG[:length]):
            return length
    return 0


class StreamSession:
    """One streamed request: reads the choices' generation streams, queues the protocol's SSE events, records the
    spans.

    Args:
        recorder: records the spans of this request.
        streams: one started generation stream per choice, in choice order.
        spec: the call (which tools are offered, the protocol).
        encoder: writes the events of the call's protocol.
    """

    def __init__(
        self, recorder: CallRecorder, streams: list[GenerationStream], spec: CallSpec, encoder: StreamEncoder
    ) -> None:
        self._recorder = recorder
        self._streams = streams
        self._spec = spec
        self._encoder = encoder
        self._events: asyncio.Queue[str | None] = asyncio.Queue()
        self._client_gone = False
        self._finished = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start reading the backend (in a task of its own: it outlives the response if the client goes away)."""
        self._task = asyncio.get_running_loop().create_task(self._produce(), name="agentbolt-gateway-stream")
        _SESSIONS.add(self._task)
        self._task.add_done_callback(_SESSIONS.discard)

    async def events(self) -> AsyncIterator[str]:
        """The SSE events to send, until the session ends."""
        while True:
            event = await self._events.get()
            if event is None:
                return
            yield event

    def detach(self) -> None:
        """The response is over. If the session has not sent everything, the client went away: cancel generation
        (the session then records what was generated, flagged). Never blocks."""
        if self._finished:
            return
        self._client_gone = True
        for stream in self._streams:
            stream.cancel()

    def _send(self, events: list[str]) -> None:
        if not self._client_gone:
            for event in events:
                self._events.put_nowait(event)

    async def _produce(self) -> None:
        async with self._recorder.keepalive():
            await self._produce_events()

    async def _produce_events(self) -> None:
        try:
            self._send(self._encoder.begin())
            outcomes = await asyncio.gather(
                *(self._pump(index, stream) for index, stream in enumerate(self._streams)), return_exceptions=True
            )
            first_error: BaseException | None = next((o for o in outcomes if isinstance(o, BaseException)), None)
            spans: list[Span] = []
            outputs: list[ChoiceOutput] = []
            for index, outcome in enumerate(outcomes):
                if isinstance(outcome, BaseException):
                    spans.append(self._recorder.error_span(index, error_info(outcome), outcome))
                    continue
                outputs.append(outcome)
                reason = REASON_NOT_DELIVERED if first_error is not None and not self._client_gone else None
                spans.append(
                    self._recorder.result_span(
                        index,
                        outcome.result,
                        message_body(outcome.content, outcome.tool_calls),
                        outcome.finish,
                        not_trainable_reason=reason,
                        client_disconnected=self._client_gone,
                    )
                )
            await self._recorder.record(spans)
            if first_error is not None:
                info = error_info(first_error)
                if info.code == "internal_error":
                    logger.error("a gateway stream failed", exc_info=first_error)
                self._send(self._encoder.error(info.status, info.type, info.message, info.code))
                return
            self._send(self._encoder.end(outputs))
        except Exception as exc:  # a bug, or the store failed: tell the client in the stream's error shape
            logger.exception("the gateway stream of %s failed", self._recorder.response_id)
            info = error_info(exc)
            self._send(self._encoder.error(info.status, info.type, info.message, info.code))
        finally:
            self._finished = True
            self._events.put_nowait(None)

    async def _pump(self, index: int, stream: GenerationStream) -> ChoiceOutput:
        """Send choice ``index`` as it is generated; return it with its content as the client received it."""
        hold = ContentHoldBack(tools_offered=bool(offered_tool_names(self._spec)))
        self._send(self._encoder.choice_begin(index))
        try:
            async for delta in stream.text_deltas():
                content = hold.feed(delta)
                if content:
                    self._send(self._encoder.text(index, content))
            result: GenerationResult = await stream.result()
        except BaseException:
            for other in self._streams:  # the request fails as a whole: stop the other choices
                other.cancel()
            raise
        output = choice_output(index, result, self._spec)
        rest, received = hold.finish(result.text, output.content, output.tool_calls)
        if rest:
            self._send(self._encoder.text(index, rest))
        output.content = received
        self._send(self._encoder.choice_end(output))
        return output


class SessionResponse(StreamingResponse):
    """The SSE response of a :class:`StreamSession`; tells the session when the response is over, however it
    ends (finished, client disconnected, server shutting down)."""

    def __init__(self, session: StreamSession) -> None:
        super().__init__(
            session.events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._session = session

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._session.detach()
