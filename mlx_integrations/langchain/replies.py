"""Chat-core events as ChatMLX's replies: whole messages, stream chunks (v0 or v1), usage.

With ``output_version="v1"`` a stream's chunks carry standard content blocks, each
with its position in the reply (``index``), so that LangChain's sum of the chunks
holds one block per thinking, text, call and malformed call, in order. Otherwise a
chunk carries text as ``content`` and thinking in ``additional_kwargs``, and the
provider's translator (:mod:`~mlx_integrations.langchain.blocks`) reads the blocks.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.messages.ai import InputTokenDetails, OutputTokenDetails, UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from mlx_integrations.chat.completion import (
    Finished,
    InvalidToolCall,
    ParsedToolCall,
    ReasoningDelta,
    TextDelta,
    Turn,
)
from mlx_integrations.langchain.blocks import PROVIDER, BlockIndexer
from mlx_integrations.langchain.messages import (
    to_lc_invalid_tool_call,
    to_lc_tool_call,
    tool_call_chunk,
)


def usage(event: Finished) -> UsageMetadata:
    """The reply's token counts; thinking tokens as ``output_token_details["reasoning"]``."""
    counts = UsageMetadata(
        input_tokens=event.prompt_tokens,
        output_tokens=event.completion_tokens,
        total_tokens=event.prompt_tokens + event.completion_tokens,
        input_token_details=InputTokenDetails(cache_read=event.cached_tokens),
    )
    if event.reasoning_tokens:
        counts["output_token_details"] = OutputTokenDetails(reasoning=event.reasoning_tokens)
    return counts


def response_metadata(event: Finished) -> dict[str, Any]:
    """The reply's ``response_metadata`` (and ``generation_info``)."""
    # model_name is the name as given (as ls_model_name), model_path the folder loaded.
    return {
        "model_name": event.model_name,
        **({"model_path": event.model_path} if event.model_path else {}),
        "model_provider": PROVIDER,
        "finish_reason": event.finish_reason,
        "time_to_first_token_s": round(event.ttft_s, 6),
        "tokens_per_second": round(event.generation_tps, 3),
        **event.speculative_metadata(),
        # As ChatOpenAI reports them (logprobs=True, top_logprobs=N).
        **({"logprobs": {"content": event.logprobs}} if event.logprobs is not None else {}),
    }


class ChunkMaker:
    """Makes the stream chunks of one reply.

    Args:
        with_usage: Put ``usage_metadata`` on the last chunk.
        v1: Standard content blocks (``output_version="v1"``) rather than text.
    """

    def __init__(self, with_usage: bool = True, v1: bool = False) -> None:
        self.with_usage = with_usage
        self.v1 = v1
        self._calls = 0
        self._blocks = BlockIndexer()

    def chunk(self, event: Any) -> ChatGenerationChunk:
        """The chunk of one chat-core event."""
        if isinstance(event, Finished):
            metadata = response_metadata(event)
            if self.v1:
                metadata["output_version"] = "v1"
            message = AIMessageChunk(
                content=[] if self.v1 else "",
                usage_metadata=usage(event) if self.with_usage else None,
                response_metadata=metadata,
                chunk_position="last",
            )
            return ChatGenerationChunk(message=message, generation_info=metadata)
        if isinstance(event, (ParsedToolCall, InvalidToolCall)):
            call = tool_call_chunk(event, self._calls)
            self._calls += 1
            content: Any = ""
            if self.v1:
                index = self._blocks.index("call")
                if isinstance(event, ParsedToolCall):
                    content = [{**call, "type": "tool_call_chunk", "index": index}]
                else:
                    content = [_invalid_block(event, index)]
            return self._message(content, tool_call_chunks=[call])
        if isinstance(event, TextDelta):
            if self.v1:
                index = self._blocks.index("text")
                return self._message([{"type": "text", "text": event.text, "index": index}])
            return self._message(event.text)
        assert isinstance(event, ReasoningDelta)
        if self.v1:
            index = self._blocks.index("reasoning")
            return self._message([{"type": "reasoning", "reasoning": event.text, "index": index}])
        return self._message("", additional_kwargs={"reasoning_content": event.text})

    def _message(self, content: Any, **fields: Any) -> ChatGenerationChunk:
        if self.v1:
            fields["response_metadata"] = {"output_version": "v1"}
        return ChatGenerationChunk(message=AIMessageChunk(content=content, **fields))


def _invalid_block(event: InvalidToolCall, index: int) -> dict[str, Any]:
    return {
        "type": "invalid_tool_call",
        "id": event.id,
        "name": event.name,
        "args": event.raw,
        "error": event.error,
        "index": index,
    }


def result_from_events(events: list[Any], v1: bool = False) -> ChatResult:
    """A whole reply: text ``content`` (the translator reads its blocks), or with ``v1``
    its blocks in the order the model wrote them (text after a call stays after it)."""
    turn = Turn()
    for event in events:
        turn.add(event)
    assert turn.finished is not None
    additional = {"reasoning_content": turn.reasoning} if turn.reasoning and not v1 else {}
    metadata = response_metadata(turn.finished)
    content: Any = turn.content
    if v1:
        content = _ordered_blocks(events)
        metadata["output_version"] = "v1"
    message = AIMessage(
        content=content,
        tool_calls=[to_lc_tool_call(c) for c in turn.tool_calls],
        invalid_tool_calls=[to_lc_invalid_tool_call(c) for c in turn.invalid_tool_calls],
        additional_kwargs=additional,
        usage_metadata=usage(turn.finished),
        response_metadata=metadata,
    )
    return ChatResult(generations=[ChatGeneration(message=message, generation_info=metadata)])


def _ordered_blocks(events: list[Any]) -> list[dict[str, Any]]:
    """A reply's v1 blocks in order: runs of text or thinking joined, each call alone."""
    blocks: list[dict[str, Any]] = []
    for event in events:
        if isinstance(event, (TextDelta, ReasoningDelta)):
            kind = "text" if isinstance(event, TextDelta) else "reasoning"
            if blocks and blocks[-1]["type"] == kind:
                blocks[-1][kind] += event.text
            else:
                blocks.append({"type": kind, kind: event.text})
        elif isinstance(event, ParsedToolCall):
            call = to_lc_tool_call(event)
            blocks.append(
                {"type": "tool_call", "id": call["id"], "name": call["name"], "args": call["args"]}
            )
        elif isinstance(event, InvalidToolCall):
            blocks.append({k: v for k, v in _invalid_block(event, 0).items() if k != "index"})
    return blocks


def result_from_chunks(chunks: list[ChatGenerationChunk]) -> ChatResult:
    """A whole reply summed from its stream chunks."""
    from langchain_core.language_models.chat_models import generate_from_stream

    return generate_from_stream(iter(chunks))


def protocol_usage(event: Finished) -> dict[str, Any]:
    """The reply's usage as the protocol's ``message-finish`` carries it."""
    return dict(usage(event))
