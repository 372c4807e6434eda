"""What mlx-vlm itself answers: the reference the adapters' vision replies must equal.

mlx-vlm's streamed text drops the bytes of an unfinished UTF-8 character, which a
random model emits often; the engines decode with the model's mlx-lm detokenizer. So
the reference is mlx-vlm's greedy *tokens*, decoded by the engine's own detokenizer:
the same tokens give the same text, and one different token changes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Reference:
    """mlx-vlm's greedy reply to one prompt."""

    tokens: list[int]
    prompt_tokens: int


class MLXVLMReference:
    """One mlx-vlm model, loaded the way mlx-vlm's own CLI loads it."""

    def __init__(self, model_path: Path) -> None:
        from mlx_vlm import load

        self.model, self.processor = load(str(model_path))

    def prompt(self, content: list[dict[str, Any]]) -> str:
        """The prompt mlx-vlm's ``apply_chat_template`` builds for one user message whose
        content parts are ``{"type": "image"}`` and ``{"type": "text", "text": ...}``."""
        from mlx_vlm import apply_chat_template

        images = sum(1 for part in content if part["type"] == "image")
        message = {"role": "user", "content": content}
        return str(
            apply_chat_template(self.processor, self.model.config, [message], num_images=images)
        )

    def reply(self, content: list[dict[str, Any]], images: list[str], max_tokens: int) -> Reference:
        """mlx-vlm's greedy tokens (at most ``max_tokens``) for one user message."""
        return self._generate(self.prompt(content), max_tokens, image=images)

    def reply_to_video(self, text: str, video: str, max_tokens: int) -> Reference:
        """mlx-vlm's greedy tokens for one user message: a video, then ``text``."""
        from mlx_vlm import apply_chat_template

        prompt = apply_chat_template(self.processor, self.model.config, text, video=[video])
        return self._generate(str(prompt), max_tokens, video=[video])

    def _generate(self, prompt: str, max_tokens: int, **media: list[str]) -> Reference:
        from mlx_vlm import stream_generate

        tokens: list[int] = []
        prompt_tokens = 0
        for response in stream_generate(
            self.model, self.processor, prompt, max_tokens=max_tokens, temperature=0.0, **media
        ):
            tokens.append(int(response.token))
            prompt_tokens = response.prompt_tokens
        eos = {int(self.model.config.eos_token_id)}
        end = next((i for i, t in enumerate(tokens) if t in eos), len(tokens))
        return Reference(tokens=tokens[: min(end, max_tokens)], prompt_tokens=prompt_tokens)


def decode(tokenizer: Any, tokens: list[int]) -> str:
    """``tokens`` as the engine's streaming detokenizer writes them."""
    detok = tokenizer.detokenizer
    detok.reset()
    for token in tokens:
        detok.add_token(token)
    detok.finalize()
    return str(detok.text)
