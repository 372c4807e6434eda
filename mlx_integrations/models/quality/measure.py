"""Compare a quantized model with its source on a short built-in English text.

One forward pass of each model over the same tokens (the source's tokenizer), the
next-token log-probabilities taken in float32: the perplexity of each model on the text,
the mean KL divergence KL(source || quantized) over the text's positions and how often
both predict the same most likely token.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from mlx_integrations.models.quality.report import KERNEL_KL, QuantizationQuality

MAX_TOKENS = 512
SAMPLE_FILE = "sample.txt"


def sample_text() -> str:
    """The built-in text: a few hundred tokens of plain English prose."""
    return resources.files(__package__).joinpath(SAMPLE_FILE).read_text(encoding="utf-8")


def measure_quality(
    source: str | Path,
    quantized: str | Path,
    *,
    text: str | None = None,
    max_tokens: int = MAX_TOKENS,
    dequantize: bool | None = None,
) -> QuantizationQuality:
    """Perplexity and KL divergence of ``quantized`` against ``source`` on one text.

    The models are loaded one after the other, so only one of them is in memory at a
    time (plus the source's log-probabilities over the text).

    Args:
        source: The unquantized model folder (its tokenizer reads the text).
        quantized: The quantized model folder.
        text: The text to read (default: :func:`sample_text`).
        max_tokens: Tokens of the text that are read, at most.
        dequantize: Run the quantized model with its weights dequantized: the same
            values through float matrix products, so the same predictions up to
            rounding. None does so on the CPU, where MLX's quantized matrix product
            is many times slower than a float one; the memory it takes is what the
            source took a moment before.

    Returns:
        The figures, with the time the comparison took. Where the quantized model ran
        on its kernels and was not close to its source, ``kernels_agree`` says whether
        the kernels predict as the same weights dequantized do (None where those are
        not close to the source either).

    Raises:
        ValueError: The text is shorter than two tokens, or the models' vocabularies differ.

    Example:
        >>> q = measure_quality("models/tiny", "models/tiny-q4")  # doctest: +SKIP
        >>> q.ppl_ratio < 1.05 and q.mean_kl < 0.05  # doctest: +SKIP
        True
    """
    import mlx.core as mx
    from mlx_lm.utils import dequantize_model, load, load_model

    if max_tokens < 2:
        raise ValueError(f"max_tokens={max_tokens} leaves nothing to predict; use 2 or more.")
    start = time.perf_counter()
    model, tokenizer = load(str(source))[:2]
    read = text if text is not None else sample_text()
    ids = list(tokenizer.encode(read))[:max_tokens]
    if len(ids) < 2:
        raise ValueError(
            f"The text is {len(ids)} token(s) long; the comparison needs at least 2 tokens."
        )
    tokens = mx.array([ids])
    targets = mx.array(ids[1:])
    reference = _log_probs(model, tokens)
    del model  # before the second model loads
    mx.clear_cache()
    model, _ = load_model(Path(quantized))
    if dequantize is None:
        dequantize = mx.default_device() == mx.cpu
    if dequantize:
        dequantize_model(model)
    candidate = _log_probs(model, tokens)
    if candidate.shape != reference.shape:
        raise ValueError(
            f"{quantized} predicts {candidate.shape[-1]} tokens, its source "
            f"{reference.shape[-1]}; they are not the same model."
        )
    quality = _figures(reference, candidate, targets)
    if not dequantize and quality.verdict != "close":
        # A backend whose kernels are wrong for this model looks like a damaged model.
        agree = _kernels_agree(model, tokens, reference, candidate, targets)
        quality = replace(quality, kernels_agree=agree)
    del model
    mx.clear_cache()
    return replace(
        quality,
        seconds=round(time.perf_counter() - start, 3),
        reference=str(source),
        text="built-in" if text is None else "custom",
        text_sha256=hashlib.sha256(read.encode("utf-8")).hexdigest(),
        device="cpu" if mx.default_device().type == mx.cpu else "gpu",
    )


def _figures(reference: Any, candidate: Any, targets: Any) -> QuantizationQuality:
    """The figures of ``candidate``'s log-probabilities against ``reference``'s (the
    time is left at 0)."""
    import mlx.core as mx

    nll_source = _mean_nll(reference, targets)
    nll_quantized = _mean_nll(candidate, targets)
    same = (reference.argmax(axis=-1) == candidate.argmax(axis=-1)).astype(mx.float32)
    return QuantizationQuality(
        ppl_source=_exp(nll_source),
        ppl_quantized=_exp(nll_quantized),
        ppl_ratio=_exp(nll_quantized - nll_source),
        mean_kl=_mean_kl(reference, candidate),
        top1_agreement=float(same.mean().item()),
        tokens=targets.size + 1,
        seconds=0.0,
    )


def _kernels_agree(
    model: Any, tokens: Any, reference: Any, candidate: Any, targets: Any
) -> bool | None:
    """Whether the quantized kernels' predictions (``candidate``) are those of the same
    weights dequantized (``model`` is dequantized in place): True where they agree,
    False where they differ while the weights dequantized are a close copy of the source,
    None where those are not close either (the quantization is at fault, and a damaged
    model's predictions move with rounding alone: SmolLM2-135M at 2 bits from bfloat16
    by a KL of 0.15 between weights dequantized to bfloat16 and exact ones)."""
    from mlx_lm.utils import dequantize_model

    dequantize_model(model)
    weights = _log_probs(model, tokens)
    if _mean_kl(weights, candidate) <= KERNEL_KL:  # NaN (kernels that broke down) is not
        return True
    return False if _figures(reference, weights, targets).verdict == "close" else None


def _log_probs(model: Any, tokens: Any) -> Any:
    """Next-token log-probabilities (float32) at every position but the last."""
    import mlx.core as mx

    logits = model(tokens)[0, :-1].astype(mx.float32)
    out = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    mx.eval(out)
    return out


def _mean_kl(p: Any, q: Any) -> float:
    """KL(P || Q) = sum_v P(v) (log P(v) - log Q(v)), averaged over the positions."""
    import mlx.core as mx

    kl = (mx.exp(p) * (p - q)).sum(axis=-1).mean().item()
    return max(float(kl), 0.0)  # rounding can leave a tiny negative for equal models


def _mean_nll(log_probs: Any, targets: Any) -> float:
    import mlx.core as mx

    picked: Any = mx.take_along_axis(log_probs, targets[:, None], axis=-1)
    return -float(picked.mean().item())


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf
