"""``POST /v1/completions``: raw text continued, without a chat template.

As ``MLXLLM.complete(..., formatted=True)`` does; ``response_format`` constrains the
text as on the chat endpoint. Several prompts, and ``n`` choices of each, are requests
sent to the engine together; choice ``p * n + i`` is the i-th of prompt p (with a
``seed``, it samples with seed + its index). ``logprobs`` N gives each token's
log-probability and the N most likely of its step, in the legacy shape (``tokens``,
``token_logprobs``, ``top_logprobs``, ``text_offset``); the tokens listed are those of
the text (see :class:`~.logprobs.TextLogprobs`).

A prompt is text or token ids. ``echo`` with ``logprobs`` scores the prompt first
(:meth:`~mlx_integrations.engine.mlx_engine.MLXEngine.prompt_logprobs`, once per prompt)
and lists its tokens before the generated ones, which are then all listed, the closing
token included: one entry per token the model read or wrote, as lm-evaluation-harness's
loglikelihood requests (``echo``, ``logprobs=1``, ``max_tokens`` 0 or 1) count them.
``max_tokens=0`` with ``echo`` generates nothing.
"""

from __future__ import annotations

import asyncio
import codecs
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

from starlette.requests import Request
from starlette.responses import Response

from mlx_integrations.chat.completion import logprob_content, token_bytes
from mlx_integrations.chat.fields import RequestError
from mlx_integrations.engine.base import GenerationOutput
from mlx_integrations.engine.logprobs import PromptLogprobs
from mlx_integrations.engine.mlx_engine import MLXEngine
from mlx_integrations.engine.params import check_raw_prompt, encode_raw_prompt
from mlx_integrations.models.resolve import vocab_size
from mlx_integrations.serve.errors import APIError, api_error
from mlx_integrations.serve.openai.chat import core_response_format, openai_error_frame
from mlx_integrations.serve.openai.logprobs import TextLogprobs
from mlx_integrations.serve.protocol import openai as wire
from mlx_integrations.serve.protocol.logprobs import CompletionLogprobs
from mlx_integrations.serve.registry import Served
from mlx_integrations.serve.replies import Accepted, json_reply, new_id, now, stream_reply
from mlx_integrations.serve.sse import closing, merged, sse, until_disconnected
from mlx_integrations.serve.state import SAMPLING_FIELDS, ServerState

__all__ = ["completions"]

# Chat-only fields: a raw prompt has no template and no thinking to budget.
_NOT_RAW = {"chat_template_kwargs", "thinking_budget"}


def _finish(out: GenerationOutput) -> Any:
    return "length" if out.finish_reason == "length" else "stop"


def _usage(outs: list[GenerationOutput], n: int) -> wire.Usage:
    """The usage of the choices (``n`` per prompt, in order): each prompt counts once,
    as OpenAI counts it; the completions add up."""
    firsts = outs[::n]
    prompt = sum(o.prompt_tokens for o in firsts)
    completion = sum(o.completion_tokens for o in outs)
    cached = sum(int(getattr(o, "cached_tokens", 0) or 0) for o in firsts)
    return wire.Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=wire.PromptTokensDetails(cached_tokens=cached),
    )


async def _echo_alone(prompt_tokens: int) -> AsyncIterator[GenerationOutput]:
    """What ``max_tokens=0`` (with ``echo``) generates: nothing, the prompt counted."""
    yield GenerationOutput(text="", prompt_tokens=prompt_tokens, finish_reason="length")


async def _generate(
    state: ServerState, served: Served, prompt: str | list[int], call: dict[str, Any]
) -> AsyncIterator[GenerationOutput]:
    """The engine's stream for a raw prompt, its figures counted at the end."""
    started = time.perf_counter()
    first: float | None = None
    stream = cast(AsyncIterator[GenerationOutput], served.engine.stream_generate(prompt, **call))
    async with closing(stream) as outs:
        async for out in outs:
            if first is None and out.new_text:
                first = time.perf_counter() - started
            if out.finished:
                cached = int(getattr(out, "cached_tokens", 0) or 0)
                state.metrics.finished(
                    served.name, out.prompt_tokens, out.completion_tokens, cached, first
                )
            yield out


async def _call(body: wire.CompletionRequest, served: Served) -> dict[str, Any]:
    """The engine's keyword arguments for the request (the engine checks their values)."""
    call: dict[str, Any] = {
        name: value
        for name in SAMPLING_FIELDS
        if name not in _NOT_RAW and (value := getattr(body, name)) is not None
    }
    call.setdefault("temperature", 1.0)
    call.setdefault("top_p", 1.0)
    call["max_tokens"] = body.max_tokens
    call["stop"] = [body.stop] if isinstance(body.stop, str) else body.stop
    if body.logprobs is not None:
        call["logprobs"] = True
        call["top_logprobs"] = body.logprobs
    response_format = core_response_format(body.response_format)
    if response_format is not None:
        from mlx_integrations.chat.request import check_response_format

        try:
            _, constraint = check_response_format(response_format)
        except (TypeError, ValueError) as exc:
            raise api_error(exc, param="response_format") from None
        if constraint is not None:
            processor = await asyncio.to_thread(constraint.make_processor, served.engine.tokenizer)
            call["logits_processors"] = [processor]
    return call


def _prompt_error(body: wire.CompletionRequest, index: int, exc: RequestError) -> APIError:
    """The 400 for prompt ``index``'s error, its path (``prompt[3]`` within the prompt)
    named as the request names it: with several prompts, or one in a list,
    ``prompt[index][3]``."""
    path = exc.path or "prompt"
    listed = isinstance(body.prompt, list) and not isinstance(body.prompt[0], int)
    if listed and path.startswith("prompt"):
        path = f"prompt[{index}]{path[len('prompt') :]}"
    return api_error(RequestError(str(exc), path))


def _check_prompts(
    body: wire.CompletionRequest, prompts: list[str | list[int]], engine: Any, scoring: bool
) -> None:
    """Each prompt checked before any work (an empty one, a token id outside the
    vocabulary), as the engine checks it, its path naming it among the others."""
    ours = isinstance(engine, MLXEngine)
    vocab = vocab_size(engine.config) if ours else None
    vision = bool(engine.is_mllm) if ours else False
    for i, prompt in enumerate(prompts):
        try:
            check_raw_prompt(
                prompt, vocab_size=vocab, vision=vision, name=body.model, scored=scoring
            )
        except RequestError as exc:
            raise _prompt_error(body, i, exc) from None


def _echo_logprobs(
    tokenizer: Any, prompt: str | list[int], scored: PromptLogprobs
) -> CompletionLogprobs:
    """A scored prompt in the legacy shape: its first token with ``null``, then each
    token's log-probability, at the character where its text starts in the echo. A
    token the engine added before a text prompt (beginning of sequence) is listed at
    0 and takes no room in the text."""
    first = token_bytes(tokenizer, scored.tokens[0])
    added = isinstance(prompt, str) and not prompt.encode("utf-8").startswith(first)
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    position = 0 if added else len(decoder.decode(first))
    entries = logprob_content(tokenizer, scored.logprobs)
    offsets = []
    for entry in entries:
        offsets.append(position)
        position += len(decoder.decode(bytes(entry["bytes"])))
    logprobs = CompletionLogprobs(
        tokens=[first.decode("utf-8", "replace")],
        token_logprobs=[None],
        top_logprobs=[None],
        text_offset=[0],
    )
    logprobs.extend(entries, offsets)
    return logprobs


def _with_seed(call: dict[str, Any], index: int) -> dict[str, Any]:
    """Choice ``index``'s arguments: with a seed, it samples with seed + index."""
    if index == 0 or call.get("seed") is None:
        return call
    return {**call, "seed": call["seed"] + index}


def _echo_text(tokenizer: Any, prompt: str | list[int]) -> str:
    """What ``echo`` puts first: the text, or the token ids' text."""
    return prompt if isinstance(prompt, str) else str(tokenizer.decode(prompt))


def _start_logprobs(
    body: wire.CompletionRequest, echoed: CompletionLogprobs | None
) -> CompletionLogprobs | None:
    """A choice's ``logprobs`` before its first token: the scored prompt's, or empty."""
    if body.logprobs is None:
        return None
    return echoed.model_copy(deep=True) if echoed is not None else CompletionLogprobs()


@dataclass
class _Choice:
    """One choice's text as it streams, and the log-probabilities of its tokens."""

    tokenizer: Any
    text: str = ""
    """The text so far, the echoed prompt included."""
    logprobs: CompletionLogprobs | None = None
    echoed: CompletionLogprobs | None = None
    """The echoed prompt's tokens (scored), which ``logprobs`` starts with."""
    every_token: bool = False
    """List every generated token as it comes, those adding no text included (after
    an echoed, scored prompt)."""
    aligned: TextLogprobs = field(default_factory=TextLogprobs)
    _offsets: list[int] = field(default_factory=list)

    def add(self, out: GenerationOutput) -> CompletionLogprobs | None:
        """Take an engine chunk; the tokens whose text has come (None: not asked)."""
        entries = getattr(out, "logprobs", None)
        start = len(self.text)
        self.text += out.new_text
        if self.logprobs is None or entries is None:
            return None
        # A chunk's first token starts where the chunk's text does; the next ones after
        # the characters of the bytes before them (a token holding the end of a
        # character starts where that character does).
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        for entry in logprob_content(self.tokenizer, entries):
            self._offsets.append(min(start, len(self.text)))
            start += len(decoder.decode(bytes(entry["bytes"])))
            self.aligned.waiting.append(entry)
        self.aligned.text(out.new_text)
        if self.every_token:
            released, self.aligned.waiting = self.aligned.waiting, []
        else:
            released = self.aligned.release()
        offsets, self._offsets = self._offsets[: len(released)], self._offsets[len(released) :]
        added = CompletionLogprobs()
        added.extend(released, offsets)
        self.logprobs.extend(released, offsets)
        return added


async def completions(body: wire.CompletionRequest, request: Request) -> Response:
    """Answer ``POST /v1/completions``."""
    state: ServerState = request.app.state.server
    accepted = Accepted(request, body)
    prompts = body.prompts()
    served = await state.served(body.model)
    scoring = body.echo and body.logprobs is not None
    if body.max_tokens == 0 and not body.echo:
        raise APIError(
            400,
            "max_tokens=0 generates nothing: it is taken with echo (to read the prompt, "
            "with logprobs its log-probabilities); ask for at least 1 token",
            param="max_tokens",
        )
    ours = isinstance(served.engine, MLXEngine)
    if not ours and (scoring or any(isinstance(p, list) for p in prompts)):
        field = "echo" if scoring else "prompt"
        raise APIError(
            400,
            f"The engine serving {body.model!r} ({type(served.engine).__name__}) takes text "
            "prompts and does not score them: send text, and leave out echo with logprobs",
            param=field,
        )
    _check_prompts(body, prompts, served.engine, scoring)
    call = await _call(body, served)
    n = body.n or 1
    completion_id = new_id("cmpl-")
    tokenizer = None
    if body.logprobs is not None or body.echo:  # reading it may load the model
        tokenizer = await asyncio.to_thread(lambda: served.engine.tokenizer)
    echoes = [_echo_text(tokenizer, p) if body.echo else "" for p in prompts]
    scored: list[CompletionLogprobs | None] = [None] * len(prompts)
    if scoring:
        for i, prompt in enumerate(prompts):
            try:
                result = await until_disconnected(
                    request.receive, served.engine.prompt_logprobs(prompt, body.logprobs)
                )
            except RequestError as exc:  # its path within this prompt: "prompt[3]"
                raise _prompt_error(body, i, exc) from None
            scored[i] = _echo_logprobs(tokenizer, prompt, result)
    choices = [
        _Choice(
            tokenizer,
            text=echoes[i // n],
            logprobs=_start_logprobs(body, scored[i // n]),
            every_token=scoring,
            echoed=scored[i // n],
        )
        for i in range(len(prompts) * n)
    ]
    if body.max_tokens == 0:  # echo alone: each prompt counted as the engine reads it
        counts = [
            len(encode_raw_prompt(tokenizer, p, p if isinstance(p, list) else None)[1])
            for p in prompts
        ]
        streams = [_echo_alone(counts[i // n]) for i in range(len(choices))]
    else:
        streams = [
            _generate(state, served, prompts[i // n], _with_seed(call, i))
            for i in range(len(choices))
        ]
    if not body.stream:

        async def whole(index: int, outs: AsyncIterator[GenerationOutput]) -> GenerationOutput:
            last = None
            async with closing(outs):
                async for last in outs:
                    choices[index].add(last)
            assert last is not None
            choices[index].text = echoes[index // n] + last.text
            return last

        outs = await until_disconnected(
            request.receive, asyncio.gather(*(whole(i, s) for i, s in enumerate(streams)))
        )
        reply = wire.Completion(
            id=completion_id,
            created=now(),
            model=body.model,
            choices=[
                wire.CompletionChoice(
                    index=i, text=c.text, finish_reason=_finish(out), logprobs=c.logprobs
                )
                for i, (c, out) in enumerate(zip(choices, outs, strict=True))
            ],
            usage=_usage(list(outs), n),
        )
        return json_reply(reply, accepted)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def frames(outs: AsyncIterator[tuple[int, GenerationOutput]]) -> AsyncIterator[bytes]:
        return _completion_frames(outs, completion_id, body.model, choices, n, include_usage)

    return await stream_reply(request, merged(streams), frames, openai_error_frame, accepted)


async def _completion_frames(
    outs: AsyncIterator[tuple[int, GenerationOutput]],
    completion_id: str,
    model: str,
    choices: list[_Choice],
    n: int,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    created = now()
    usage: dict[str, Any] = {"usage": None} if include_usage else {}

    def chunk(index: int, text: str, finish: Any, logprobs: Any = None) -> bytes:
        choice = wire.CompletionChoice(
            index=index, text=text, finish_reason=finish, logprobs=logprobs
        )
        return sse(
            wire.Completion(
                id=completion_id, created=created, model=model, choices=[choice], **usage
            )
        )

    for index, choice in enumerate(choices):
        if choice.text or choice.echoed:  # the echoed prompt
            yield chunk(index, choice.text, None, choice.echoed)
    last: dict[int, GenerationOutput] = {}
    async with closing(outs):
        async for index, out in outs:
            logprobs = choices[index].add(out)
            if out.finished:
                last[index] = out
                yield chunk(index, out.new_text, _finish(out), logprobs)
            elif out.new_text or (logprobs is not None and logprobs.tokens):
                yield chunk(index, out.new_text, None, logprobs)
    if include_usage and len(last) == len(choices):
        yield sse(
            wire.Completion(
                id=completion_id,
                created=created,
                model=model,
                choices=[],
                usage=_usage([last[i] for i in range(len(choices))], n),
            )
        )
    yield sse("[DONE]")
