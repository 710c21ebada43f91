"""Stop strings over generated text. Pure: no torch, no I/O.

A request's stop strings end generation once the generated text contains one (OpenAI ``stop``, Anthropic
``stop_sequences``). The backend checks after each token (:func:`find_stop` on the text's tail), cuts the returned
text before the first stop string (after it, for an inclusive one), and while streaming holds back any trailing
piece that could still become a stop string (:class:`StopTextFilter`), so that the streamed pieces add up to the
returned text.
"""

from __future__ import annotations

from collections.abc import Sequence


def find_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """The earliest stop string in ``text``: ``(position, stop)``, or ``None``. When two start at the same
    position, the longer one wins (it is the one that ends later, so both are then in the text)."""
    best: tuple[int, str] | None = None
    for stop in stops:
        if not stop:
            continue
        at = text.find(stop)
        if at < 0:
            continue
        if best is None or at < best[0] or (at == best[0] and len(stop) > len(best[1])):
            best = (at, stop)
    return best


def cut_at_stop(text: str, stops: Sequence[str], inclusive: Sequence[str] = ()) -> tuple[str, str | None]:
    """``(text up to the first stop string, that stop)``: the text ends before an ordinary stop string and after
    an inclusive one; ``(text, None)`` when there is none."""
    found = find_stop(text, [*stops, *inclusive])
    if found is None:
        return text, None
    at, stop = found
    if stop in inclusive and stop not in stops:
        return text[: at + len(stop)], stop
    return text[:at], stop


def _partial_suffix(text: str, stops: Sequence[str]) -> int:
    """Length of the longest end of ``text`` that is a proper beginning of some stop string."""
    longest = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:length]):
                longest = length
                break
    return longest


class StopTextFilter:
    """Streamed text with stop strings applied: :meth:`feed` returns what may be sent now; nothing after the first
    stop string is ever sent (an inclusive stop string is sent whole), and a trailing piece that may be the
    beginning of a stop string is held back until it is known not to be one. With no stop strings every delta
    passes as it is.
    """

    def __init__(self, stops: Sequence[str], inclusive: Sequence[str] = ()) -> None:
        self._stops = [s for s in stops if s]
        self._inclusive = [s for s in inclusive if s]
        self._all = [*self._stops, *self._inclusive]
        self._text = ""
        self._sent = 0
        self.stopped = False
        """A stop string has been seen: nothing more will be sent."""

    def feed(self, delta: str) -> str:
        """Add ``delta``; return the text that may be sent now (possibly ``""``)."""
        if self.stopped:
            return ""
        if not self._all:
            self._sent += len(delta)
            return delta
        self._text += delta
        cut, stop = cut_at_stop(self._text, self._stops, self._inclusive)
        if stop is not None:
            self.stopped = True
            end = len(cut)
        else:
            end = len(self._text) - _partial_suffix(self._text, self._all)
        if end <= self._sent:
            return ""
        out = self._text[self._sent : end]
        self._sent = end
        return out
