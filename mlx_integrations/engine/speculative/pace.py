"""Which kind of decode step emits tokens faster here: wide (drafts verified) or plain.

Speculation pays only where a verification pass over several positions costs less than
the tokens it gains: on a GPU, where a step's time is mostly fixed host work, it usually
does; on a CPU with a small model, where the cost grows with the tokens fed, it often
does not. ``BatchedEngine``'s shared batch asks a :class:`StepPace` before a step
that could draft; a request decoding alone with prompt lookup asks a
:class:`LookupPace`, which also weighs how far the match it would draft from has been
followed.
"""

from __future__ import annotations

import math
from typing import Literal

StepKind = Literal["round", "pipelined", "step"]
"""A timed step of a request alone: a verification round, a plain step started before
the one before it was read, or a plain step nothing ran ahead of."""


def _average(old: float | None, new: float, weight: float = 0.25) -> float:
    """A moving average: ``new`` alone while there is none yet."""
    return new if old is None else old + weight * (new - old)


class StepPace:
    """Which kind of step emits tokens faster on this machine and model: wide or plain.

    A wide step feeds every row several positions; where the model's cost grows with
    the tokens fed (a small model on the CPU), it can emit fewer tokens per second
    than plain steps do despite accepted drafts. Each kind's tokens per second is a
    moving average over runs of its own steps (the first step of a run is timed only
    while its kind has no figure yet: it pays for, or skips, the other kind's pipelined
    work, but where steps that can draft never come two in a row it is the only
    measure there is). Steps that could draft go
    the faster way; every ``probe_every`` of them (times the lead's ratio, up to 8),
    the other kind runs ``run`` steps to measure it again, and no more often than keeps
    the probes' time under ``probe_share`` of the time: where a slower step costs much
    more than a faster one (a draft model as large as the model, a wide step on the
    CPU), probes come rarer still. Only the choice depends on timing, never a token.
    """

    def __init__(self, probe_every: int = 32, run: int = 3, probe_share: float = 0.05):
        self.rate: dict[bool, float | None] = {False: None, True: None}
        self.step_s: dict[bool, float | None] = {False: None, True: None}
        """Each kind's seconds per step (moving average)."""
        self._probe_share = probe_share
        self._probe_every, self._run = probe_every, run
        self._probe_left = 0
        self._since_probe = 0
        self._last: bool | None = None
        self._probe = False

    def wide(self) -> bool:
        """Whether a step where enough rows have drafts goes wide."""
        if self._probe_left > 0:
            self._probe_left -= 1
            return self._probe
        plain, wide = self.rate[False], self.rate[True]
        if wide is None or plain is None:
            return wide is None  # measure wide steps first, then plain ones
        best = wide >= plain
        # The clearer the lead, the rarer the probes (up to 8 times rarer).
        lead = max(wide, plain) / max(min(wide, plain), 1e-9)
        every = self._probe_every * min(8, max(1, round(lead)))
        # A run of probes costs about run * (its step time) of the way not taken.
        probe_s, step_s = self.step_s[not best], self.step_s[best]
        if probe_s is not None and step_s is not None:
            every = max(
                every, math.ceil(self._run * probe_s / self._probe_share / max(step_s, 1e-9))
            )
        self._since_probe += 1
        if self._since_probe > every:
            self._since_probe, self._probe_left, self._probe = 0, self._run - 1, not best
            return not best
        return best

    def record(self, wide: bool, tokens: int, seconds: float) -> None:
        """A step of the given kind emitted ``tokens`` in ``seconds``."""
        if seconds > 0 and (self._last == wide or self.rate[wide] is None):
            self.rate[wide] = _average(self.rate[wide], tokens / seconds)
            self.step_s[wide] = _average(self.step_s[wide], seconds)
        self._last = wide


class LookupPace:
    """Whether a prompt-lookup round pays for a request decoding alone.

    A round verifies ``[last token, drafts...]`` in one forward pass and emits the
    drafts the model agrees with plus its own next token; it is one host sync, while
    plain steps are pipelined. So a round pays when the tokens it is expected to emit
    outnumber the plain steps that take as long as it does: ``expected > round_s /
    step_s``. The expectation is kept per length of the n-gram the drafts follow (a
    3-token match in a quoted passage is followed far more often than a 1-token one in
    free text), as a moving average over real rounds and over *shadow* rounds: while
    decoding plainly, the drafts a round would have verified are compared with the
    tokens the model then picks, at no cost, so the figure stays current where rounds
    are not run. Seconds per round and per pipelined plain step are moving averages of
    timed ones, each from the end of the step before (so the caller's handling of the
    tokens in between is counted too). After ``probe_every`` declined matches in a
    row a round runs anyway, so that one round timed in a busy moment cannot rule
    rounds out for good. Only the choice depends on timing, never a token.
    """

    def __init__(self, weight: float = 0.3, probe_every: int = 64):
        self._weight = weight
        self._probe_every = probe_every
        self.expected: dict[int, float] = {}
        """n-gram length -> tokens a round drafting from such a match emits (average)."""
        self.round_s: float | None = None
        self.step_s: float | None = None
        """Seconds per pipelined plain step."""
        self._declined = 0

    def worth(self, n: int) -> bool:
        """Whether to verify drafts that follow an ``n``-token match now."""
        if self.round_s is None:
            return True  # measure a round first
        if self.step_s is None:
            return False  # then a plain step
        expected = self.expected.get(n)
        if expected is None or expected * self.step_s > self.round_s:
            self._declined = 0
            return True
        self._declined += 1
        if self._declined >= self._probe_every:
            self._declined = 0
            return True
        return False

    def observe(self, n: int, emitted: int) -> None:
        """A round drafting from an ``n``-token match emitted (or would have) ``emitted``."""
        self.expected[n] = _average(self.expected.get(n), emitted, self._weight)

    def timed(self, kind: StepKind, seconds: float) -> None:
        """A step took ``seconds``: ``"round"``, ``"pipelined"`` (a plain step started
        before the one before it was read) or ``"step"`` (a plain step nothing ran
        ahead of, which counts only while pipelined ones have no figure yet)."""
        if seconds <= 0 or (kind == "step" and self.step_s is not None):
            return
        if kind == "round":
            self.round_s = _average(self.round_s, seconds)
        else:
            self.step_s = _average(self.step_s, seconds)
