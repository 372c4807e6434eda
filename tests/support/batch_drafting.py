"""What the rows of ``BatchedEngine``'s shared batch drafted, step by step.

:func:`record_wide_steps` makes every step where enough rows can draft go wide, and a
row left alone draft wherever its context has a match (else ``StepPace`` and
``LookupPace`` pick by timing, and which steps draft would depend on the machine's
speed), and records, for each wide step, the drafts each row kept or cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest


@dataclass
class WideSteps:
    accepted: list[int] = field(default_factory=list)
    """Drafts the model agreed with, per wide step."""
    rejected: list[int] = field(default_factory=list)
    """Rows whose drafts were cut short by a sample that differs, per wide step."""


def record_wide_steps(monkeypatch: pytest.MonkeyPatch) -> WideSteps:
    from mlx_integrations.engine.batched.speculation import BatchSpeculation
    from mlx_integrations.engine.speculative.pace import LookupPace, StepPace

    monkeypatch.setattr(StepPace, "wide", lambda self: True)
    # A row left alone drafts by its own pace: wherever its context has a match.
    monkeypatch.setattr(LookupPace, "worth", lambda self, n: True)
    steps = WideSteps()
    verify = BatchSpeculation._verify

    def recording(self, batch, pending, drafts):
        uids = list(batch.uids)  # rows that end in the step leave the batch
        responses = verify(self, batch, pending, drafts)
        kept = {uid: 0 for uid in uids}
        for r in responses:
            kept[r.uid] += r.accepted
        steps.accepted.append(sum(kept.values()))
        steps.rejected.append(
            sum(1 for uid, d in zip(uids, drafts, strict=True) if kept[uid] < len(d))
        )
        return responses

    monkeypatch.setattr(BatchSpeculation, "_verify", recording)
    return steps
