"""Stop sequences over streamed text, including ones that span token boundaries."""

from __future__ import annotations


class StopMatcher:
    """Holds back text that may be the start of a stop sequence.

    Feed decoded text with :meth:`feed`; it returns what is safe to emit. A stop
    sequence is never emitted, not even in part: text that could begin one stays
    pending until the next piece tells whether it does.

    Examples:
        >>> m = StopMatcher(["</s>"])
        >>> m.feed("Hello </"), m.feed("s> tail")
        ('Hello ', '')
        >>> m.stopped
        True
    """

    def __init__(self, stops: list[str]):
        self._stops = [s for s in stops if s]
        self._pending = ""
        self.stopped = False
        self.matched: str | None = None

    @property
    def watching(self) -> bool:
        """Whether there is any stop sequence to look for."""
        return bool(self._stops)

    def feed(self, text: str) -> str:
        """Add text; return the part that can be emitted now."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        buf = self._pending + text
        first = None
        for stop in self._stops:
            at = buf.find(stop)
            if at != -1 and (first is None or at < first[0]):
                first = (at, stop)
        if first is not None:
            self.stopped = True
            self.matched = first[1]
            self._pending = ""
            return buf[: first[0]]
        hold = partial_suffix_len(buf, self._stops)
        self._pending = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold]

    def flush(self) -> str:
        """Release held text at the end of generation (it was not a stop after all)."""
        out, self._pending = self._pending, ""
        return "" if self.stopped else out


def partial_suffix_len(text: str, needles: list[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a needle.

    That much text must be held back: the next piece may complete the needle.
    """
    best = 0
    for needle in needles:
        for n in range(min(len(needle) - 1, len(text)), best, -1):
            if text.endswith(needle[:n]):
                best = n
                break
    return best
