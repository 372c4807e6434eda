"""What quantization cost a model, and whether that is worth a warning."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

# Above either figure the quantized model is no longer a close copy of its source.
# Chosen from measurements on SmolLM2-135M-Instruct and tiny random models:
# see QuantizationQuality.verdict.
DEGRADED_PPL_RATIO = 1.10
DEGRADED_KL = 0.10
# Above either of these its answers come out garbled.
DAMAGED_PPL_RATIO = 1.50
DAMAGED_KL = 0.50

Verdict = Literal["close", "degraded", "damaged"]


class QuantizationSettings(Protocol):
    """The settings a warning's advice looks at (a ``QuantizationInfo``)."""

    @property
    def bits(self) -> int: ...
    @property
    def group_size(self) -> int: ...
    @property
    def mode(self) -> str: ...
    @property
    def recipe(self) -> str | None: ...


@dataclass(frozen=True)
class QualityWarning:
    """A warning about a quantized model, and what to do about it."""

    message: str
    hint: str


@dataclass(frozen=True)
class QuantizationQuality:
    """How closely a quantized model follows its source on a short English text.

    Attributes:
        ppl_source: Perplexity of the source model on the text.
        ppl_quantized: Perplexity of the quantized model on the same tokens.
        ppl_ratio: ``ppl_quantized / ppl_source`` (1.0: no loss).
        mean_kl: Mean KL divergence KL(source || quantized) of the next-token
            distributions over the text's positions, in nats (0.0: the same predictions).
        tokens: Tokens of the text that both models read.
        seconds: Time the comparison took (loading both models included).

    Example:
        >>> q = QuantizationQuality(20.0, 20.4, 1.02, 0.01, 480, 2.5)
        >>> q.verdict
        'close'
    """

    ppl_source: float
    ppl_quantized: float
    ppl_ratio: float
    mean_kl: float
    tokens: int
    seconds: float

    @property
    def verdict(self) -> Verdict:
        """``"close"``, ``"degraded"`` (noticeably worse) or ``"damaged"`` (garbled).

        8-bit models stay ``"close"`` (ratio about 1.00, KL about 0.001). A figure that is
        not finite means the quantized model broke down: ``"damaged"``.
        """
        if not (math.isfinite(self.ppl_ratio) and math.isfinite(self.mean_kl)):
            return "damaged"
        if self.ppl_ratio > DAMAGED_PPL_RATIO or self.mean_kl > DAMAGED_KL:
            return "damaged"
        if self.ppl_ratio > DEGRADED_PPL_RATIO or self.mean_kl > DEGRADED_KL:
            return "degraded"
        return "close"

    def warning(self, settings: QuantizationSettings | None = None) -> QualityWarning | None:
        """A warning when the model is not a close copy of its source, else None.

        Args:
            settings: The quantization used (``manifest.quantization``); the hint names
                remedies that differ from it.
        """
        verdict = self.verdict
        if verdict == "close":
            return None
        figures = f"perplexity x{self.ppl_ratio:.2f}, KL {self.mean_kl:.3f} against its source"
        if verdict == "damaged":
            message = f"the quantized model is badly damaged ({figures}); expect garbled answers."
        else:
            message = f"the quantized model is noticeably worse ({figures})."
        return QualityWarning(message, _remedies(settings))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready figures, with the verdict."""
        return {**asdict(self), "verdict": self.verdict}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuantizationQuality:
        """Read :meth:`to_dict` data (a verdict in it is worked out again, not read)."""
        return cls(
            ppl_source=float(data["ppl_source"]),
            ppl_quantized=float(data["ppl_quantized"]),
            ppl_ratio=float(data["ppl_ratio"]),
            mean_kl=float(data["mean_kl"]),
            tokens=int(data["tokens"]),
            seconds=float(data.get("seconds", 0.0)),
        )


def _remedies(settings: QuantizationSettings | None) -> str:
    """The settings that keep more of the model, as ``mlxi quantize`` options."""
    options = []
    if settings is None or settings.bits < 8:
        options.append("--bits 8")
    if settings is None or (
        settings.mode == "affine" and settings.recipe is None and settings.group_size > 32
    ):
        options.append("--group-size 32")
    if settings is None or (settings.mode == "affine" and settings.recipe != "mixed_4_6"):
        options.append("--recipe mixed_4_6")
    if not options:
        return "Quantize with more bits, or use the unquantized model."
    return "Quantize again with " + ", ".join(options[:-1]) + (
        f" or {options[-1]}" if len(options) > 1 else options[-1]
    ) + " (mlxi quantize ... --force)."
