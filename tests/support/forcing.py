"""Make a random tiny model write a chosen text: a logits processor that masks the rest.

It lets tests drive the real engine and adapters end to end with known output (tool
calls, reasoning blocks, multi-byte text) without a trained model.
"""

from __future__ import annotations

from typing import Any


def forcing(tokenizer: Any, text: str) -> tuple[Any, list[int]]:
    """Return (processor, token ids): the processor makes the model write ``text``, then EOS."""
    import mlx.core as mx

    sequence = tokenizer.encode(text, add_special_tokens=False)
    eos = next(iter(tokenizer.eos_token_ids))
    state: dict[str, int | None] = {"start": None}

    def processor(history: Any, logits: Any) -> Any:
        if state["start"] is None:
            state["start"] = history.size
        i = history.size - state["start"]
        want = sequence[i] if i < len(sequence) else eos
        mask = mx.full(logits.shape, -1e9)
        mask[..., want] = 0
        return logits + mask

    return processor, sequence
