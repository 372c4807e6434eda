"""MLXLLM's replies: chat-core events folded into LlamaIndex responses, and structured
output read from them (whole, or as partial objects while the JSON streams in).

A reply's thinking is a ``ThinkingBlock`` (its token count once the reply is over) and
each call a ``ToolCallBlock``; while a reply streams, each response carries the new
thinking as ``additional_kwargs["thinking_delta"]``, which ``FunctionAgent`` passes on
in its ``AgentStream`` events.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    LogProb,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from pydantic import BaseModel

from mlx_integrations.chat.completion import Finished, ReasoningDelta, TextDelta, Turn


class StructuredStream:
    """Partial objects of ``output_cls`` from a stream of responses, then the complete one."""

    def __init__(self, output_cls: type[BaseModel]) -> None:
        self.output_cls = output_cls
        self.last: ChatResponse | None = None

    def add(self, response: ChatResponse) -> Any:
        """The partial object so far, or None (not enough JSON yet, or the last chunk)."""
        self.last = response
        if response.raw is not None:
            return None
        return partial_object(self.output_cls, response.message.content or "")

    def result(self) -> BaseModel:
        assert self.last is not None
        return parse_structured(self.output_cls, self.last)


class StructuredOutputTruncated(ValueError):
    """The structured output stopped at max_tokens before the JSON was complete."""


def parse_structured(output_cls: type[BaseModel], response: ChatResponse) -> BaseModel:
    text = response.message.content or ""
    raw = response.raw or {}
    if raw.get("finish_reason") == "length":
        raise StructuredOutputTruncated(
            f"The {output_cls.__name__} output was cut off at max_tokens before it was "
            f"complete ({len(text)} characters); raise max_tokens. Output so far: {text[:200]!r}"
        )
    return output_cls.model_validate_json(text)


def partial_object(output_cls: type[BaseModel], text: str) -> Any:
    """A lenient instance of ``output_cls`` from incomplete JSON, or None."""
    from llama_index.core.llms.utils import parse_partial_json
    from llama_index.core.program.utils import create_flexible_model

    try:
        data = parse_partial_json(text)
        return create_flexible_model(output_cls).model_validate(data)
    except Exception:  # not enough JSON yet
        return None


def usage_raw(
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
    finish_reason: str | None,
    model: str | None,
) -> dict[str, Any]:
    return {
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "cached_tokens": cached_tokens,
        },
        "finish_reason": finish_reason,
        "model": model,
    }


class ResponseState:
    """Folds events into the successive ChatResponses of one stream."""

    def __init__(self) -> None:
        self.turn = Turn()
        self.logprobs: list[list[LogProb]] | None = None
        """Per token, its step's most likely tokens (or the token alone), once known."""

    def _message(self) -> ChatMessage:
        turn = self.turn
        blocks: list[Any] = []
        if turn.reasoning:
            # The token count is known once the reply is over.
            tokens = turn.finished.reasoning_tokens if turn.finished else None
            blocks.append(ThinkingBlock(content=turn.reasoning, num_tokens=tokens or None))
        blocks.append(TextBlock(text=turn.content))
        blocks.extend(
            ToolCallBlock(tool_call_id=c.id, tool_name=c.name, tool_kwargs=c.arguments)
            for c in turn.tool_calls
        )
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)

    def add(self, event: Any) -> ChatResponse:
        self.turn.add(event)
        extra: dict[str, Any] = {}
        delta = event.text if isinstance(event, TextDelta) else ""
        if isinstance(event, ReasoningDelta):
            extra["thinking_delta"] = event.text
        raw = None
        if isinstance(event, Finished):
            raw = usage_raw(
                event.prompt_tokens,
                event.completion_tokens,
                event.cached_tokens,
                event.finish_reason,
                event.model_name,
            )
            if event.model_path:
                raw["model_path"] = event.model_path  # "model" is the name as given
            raw["usage"]["reasoning_tokens"] = event.reasoning_tokens
            raw["time_to_first_token_s"] = event.ttft_s
            raw["tokens_per_second"] = event.generation_tps
            raw.update(event.speculative_metadata())
            if event.logprobs is not None:
                raw["logprobs"] = {"content": event.logprobs}
                self.logprobs = [
                    [
                        LogProb(token=t["token"], logprob=t["logprob"], bytes=t["bytes"])
                        for t in (entry["top_logprobs"] or [entry])
                    ]
                    for entry in event.logprobs
                ]
        if self.turn.invalid_tool_calls:
            extra["invalid_tool_calls"] = [
                {"id": c.id, "name": c.name, "raw": c.raw, "error": c.error}
                for c in self.turn.invalid_tool_calls
            ]
        return ChatResponse(
            message=self._message(),
            delta=delta,
            raw=raw,
            additional_kwargs=extra,
            logprobs=self.logprobs if raw is not None else None,
        )


def final_response(last: ChatResponse) -> ChatResponse:
    extra = {k: v for k, v in last.additional_kwargs.items() if k != "thinking_delta"}
    return ChatResponse(
        message=last.message, raw=last.raw, additional_kwargs=extra, logprobs=last.logprobs
    )
