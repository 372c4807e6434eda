"""What quantization cost a model, and whether that is worth a warning."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

# SmolLM2-135M-Instruct (float32 source) on the built-in text, as (perplexity ratio,
# mean KL): 8 bits (1.006, 0.001), 6 bits (1.05, 0.02), 5 bits (1.05, 0.09),
# 4 bits group 64 (1.32, 0.37) and group 32 (1.24, 0.29), both with garbled answers,
# 3 bits (3.7 to 5.2, 1.4 to 1.8), 2 bits (over 1000, 7 to 12). Larger models lose
# less at 4 bits (a KL of a few hundredths is usual), and stay "close".
DEGRADED_PPL_RATIO = 1.10
DEGRADED_KL = 0.10
DAMAGED_PPL_RATIO = 1.20
DAMAGED_KL = 0.25
# Mean KL between the quantized kernels' predictions and those of the same weights
# dequantized: rounding leaves about 1e-6 in float32, and about 1e-3 where bfloat16
# weights dequantized round apart from the kernels' float32 arithmetic (SmolLM2-135M at
# 3 and 4 bits; 0.15 at 2 bits, a model damaged past judging); a kernel that computes
# the wrong product leaves about 1.
KERNEL_KL = 0.01

Verdict = Literal["close", "degraded", "damaged"]

_RECIPE_FOR_BITS = {2: "mixed_2_6", 3: "mixed_3_6", 4: "mixed_4_6"}


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
        top1_agreement: Share of the positions where both models rank the same token
            first (1.0: always).
        tokens: Tokens of the text that both models read.
        seconds: Time the comparison took (loading both models included).
        kernels_agree: Whether MLX's quantized kernels on the device that measured
            predict as the same weights dequantized do (mean KL under ``KERNEL_KL``).
            Checked where the quantized model ran on its kernels and was not close to
            its source; None where it was not checked, or where they differ but the
            weights dequantized are not close to the source either (the quantization
            is at fault then). False means this device's kernels compute the wrong products
            for this model, whose weights dequantized are a close copy of its source:
            the quantization is not at fault, and the model answers badly on this device.
        reference: The model the quantized one was compared with (a store name as given,
            else the folder's absolute path).
        text: What was read: ``"built-in"`` (:func:`~.measure.sample_text`) or
            ``"custom"`` (a text given to :func:`~.measure.measure_quality`).
        text_sha256: The sha256 of the text read (UTF-8), before it was cut to ``tokens``.
        device: ``"cpu"`` or ``"gpu"``: the device the comparison ran on (by default
            the CPU runs the quantized weights dequantized, a GPU its quantized kernels).
            This and the three above are None in figures recorded before they were kept.

    Examples:
        >>> q = QuantizationQuality(20.0, 20.4, 1.02, 0.01, 0.97, 480, 2.5)
        >>> q.verdict, q.warning()
        ('close', None)
        >>> QuantizationQuality(22.8, 30.2, 1.32, 0.37, 0.63, 510, 9.0).verdict
        'damaged'
    """

    ppl_source: float
    ppl_quantized: float
    ppl_ratio: float
    mean_kl: float
    top1_agreement: float
    tokens: int
    seconds: float
    kernels_agree: bool | None = None
    reference: str | None = None
    text: str | None = None
    text_sha256: str | None = None
    device: str | None = None

    @property
    def verdict(self) -> Verdict:
        """``"close"``, ``"degraded"`` (noticeably worse) or ``"damaged"`` (expect garbled
        answers).

        ``"degraded"`` past a perplexity ratio of 1.10 or a mean KL of 0.10 nats,
        ``"damaged"`` past 1.20 or 0.25. A figure that is not finite means the quantized
        model broke down: ``"damaged"``.
        """
        if not (math.isfinite(self.ppl_ratio) and math.isfinite(self.mean_kl)):
            return "damaged"
        if self.ppl_ratio > DAMAGED_PPL_RATIO or self.mean_kl > DAMAGED_KL:
            return "damaged"
        if self.ppl_ratio > DEGRADED_PPL_RATIO or self.mean_kl > DEGRADED_KL:
            return "degraded"
        return "close"

    def warning(
        self, settings: QuantizationSettings | None = None, *, kept: bool = True
    ) -> QualityWarning | None:
        """A warning when the model is not a close copy of its source, else None.

        Args:
            settings: The quantization used (``manifest.quantization``): the hint
                names settings that keep more of the model than these.
            kept: The model is in the store (quantizing again under its name needs
                ``--force``); False for one that ``strict`` did not keep.
        """
        verdict = self.verdict
        if verdict == "close":
            return None
        figures = (
            f"perplexity x{self.ppl_ratio:.2f} and KL {self.mean_kl:.2f} against its source; "
            f"the same next token at {self.top1_agreement:.0%} of positions"
        )
        if self.kernels_agree is False:
            return QualityWarning(
                f"MLX's quantized kernels computed wrong products for this model on the "
                f"device that measured it ({figures}), while its weights dequantized "
                "predicted as expected: expect garbled answers there.",
                "The quantization is not at fault: upgrade MLX and quantize again"
                f"{' with --force' if kept else ''} to measure again, or on that device use "
                "the unquantized model.",
            )
        if verdict == "damaged":
            message = f"the quantized model lost too much ({figures}): expect garbled answers."
        else:
            message = f"the quantized model is noticeably worse than its source ({figures})."
        return QualityWarning(message, remedies(settings, kept=kept))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready figures, with the verdict (the manifest stores this form)."""
        return {**asdict(self), "verdict": self.verdict}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuantizationQuality:
        """Read :meth:`to_dict` data.

        The verdict stored with the figures is worked out again from them, not read: the
        figures are what was measured, the thresholds are this version's.
        """
        return cls(
            ppl_source=float(data["ppl_source"]),
            ppl_quantized=float(data["ppl_quantized"]),
            ppl_ratio=float(data["ppl_ratio"]),
            mean_kl=float(data["mean_kl"]),
            top1_agreement=float(data["top1_agreement"]),
            tokens=int(data["tokens"]),
            seconds=float(data["seconds"]),
            # Absent from older manifests.
            kernels_agree=_flag(data.get("kernels_agree")),
            reference=_text(data, "reference"),
            text=_text(data, "text"),
            text_sha256=_text(data, "text_sha256"),
            device=_text(data, "device"),
        )


def _text(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None or isinstance(value, str):
        return value
    raise ValueError(f"{key} must be a string or null, got {value!r}")


def _flag(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise ValueError(f"kernels_agree must be true, false or null, got {value!r}")


def remedies(settings: QuantizationSettings | None, *, kept: bool = True) -> str:
    """The ``mlxi quantize`` options that keep more of a model than ``settings`` did,
    strongest first.

    Args:
        settings: The quantization used.
        kept: The model was stored, so quantizing again under its name needs ``--force``.
    """
    force = " and --force" if kept else ""
    if settings is not None and settings.mode != "affine":
        stronger = ["--mode affine --bits 8"]
        if settings.mode != "mxfp8":
            stronger.insert(0, "--mode mxfp8")
        return f"Quantize again with {' or '.join(stronger)}{force}."
    bits = settings.bits if settings is not None else 4
    if bits >= 8:
        return "This model does not take quantization well: use the unquantized model."
    more_bits = "--bits 8" if bits >= 6 else "--bits 8 (or 6)"
    weaker = []
    if settings is None or settings.group_size > 32:
        weaker.append("--group-size 32")
    recipe = _RECIPE_FOR_BITS.get(bits) if settings is None or settings.recipe is None else None
    if settings is not None and settings.recipe not in (None, "mixed_4_6"):
        recipe = "mixed_4_6"
    if recipe is not None:
        weaker.append(f"--recipe {recipe}")
    verb = "improves" if len(weaker) == 1 else "improve"
    tail = f"; {' or '.join(weaker)} {verb} it less" if weaker else ""
    return f"Quantize again with {more_bits}{force}{tail}."
