"""The libraries that speak Ollama, pointed at ``mlxi serve``: LangChain's ChatOllama and
OllamaEmbeddings, LlamaIndex's Ollama, ollama-python's embeddings; a vision model's
images, SmolLM2-135M's tool calls and JSON schemas."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import ollama
import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from pydantic import BaseModel

from mlx_integrations.embeddings import get_embedding_engine
from mlx_integrations.serve.config import ModelConfig, ServeConfig
from mlx_integrations.serve.server import BackgroundServer
from tests.support.tiny_vlm import make_test_image

TEXTS = ["MLX runs on Apple silicon.", "So does this sentence."]


class Capital(BaseModel):
    city: str
    country: str


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


@pytest.fixture(scope="module")
def minilm() -> Path:
    from tests.support.minilm import ensure_minilm

    return ensure_minilm()


@pytest.fixture(scope="module")
def url(tiny_vlm: Path, minilm: Path) -> Iterator[str]:
    config = ServeConfig(
        models=[
            ModelConfig("vlm", source=str(tiny_vlm), preload=True),
            ModelConfig("minilm", source=str(minilm), preload=True),
        ],
        only_listed=True,
    )
    with BackgroundServer(config) as base:
        yield base


@pytest.fixture(scope="module")
def smollm_url(smollm2_path: Path) -> Iterator[str]:
    config = ServeConfig(
        models=[
            ModelConfig(
                "smollm", source=str(smollm2_path), options={"cache_memory_mb": 0}, preload=True
            )
        ],
        only_listed=True,
    )
    with BackgroundServer(config) as base:
        yield base


def _chat_ollama(url: str, model: str, **settings: object):
    from langchain_ollama import ChatOllama

    # A 135M model loops at greedy without a repetition penalty.
    defaults: dict[str, object] = {"temperature": 0, "num_predict": 64, "repeat_penalty": 1.3}
    return ChatOllama(base_url=url, model=model, **{**defaults, **settings})


# ------------------------------------------------------------------ embeddings


def test_embeddings_are_the_engines_through_each_client(url: str, minilm: Path):
    from langchain_ollama import OllamaEmbeddings

    local = get_embedding_engine(minilm).embed(TEXTS)
    client = ollama.Client(host=url)
    batch = client.embed(model="minilm", input=TEXTS)
    one = client.embeddings(model="minilm:latest", prompt=TEXTS[0])
    langchain = OllamaEmbeddings(base_url=url, model="minilm")
    for got in (
        batch.embeddings,
        [one.embedding, local[1]],
        langchain.embed_documents(TEXTS),
        [langchain.embed_query(TEXTS[0]), local[1]],
    ):
        assert len(got) == 2
        for vector, want in zip(got, local, strict=True):
            assert len(vector) == 384
            assert max(abs(a - b) for a, b in zip(vector, want, strict=True)) < 1e-5
    assert batch.prompt_eval_count and batch.prompt_eval_count > len(TEXTS)
    assert client.show("minilm").capabilities == ["embedding"]
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model="minilm", input=TEXTS, dimensions=128)
    assert refused.value.status_code == 400 and "384" in refused.value.error
    with pytest.raises(ollama.ResponseError) as chat:
        client.chat(model="minilm", messages=[{"role": "user", "content": "hi"}])
    assert chat.value.status_code == 400 and "embedding model" in chat.value.error


# ---------------------------------------------------------------------- images


def test_images_reach_a_vision_model(url: str, tmp_path: Path):
    image = make_test_image(tmp_path / "stripes.png", "stripes")
    data = base64.b64encode(image.read_bytes()).decode()
    client = ollama.Client(host=url)
    question = {"role": "user", "content": "What is in the picture?"}
    options = {"temperature": 0, "num_predict": 4}
    plain = client.chat(model="vlm", messages=[question], options=options)
    seen = client.chat(model="vlm", messages=[{**question, "images": [image]}], options=options)
    # The image's tokens are in the prompt.
    assert seen.prompt_eval_count > plain.prompt_eval_count + 4  # type: ignore[operator]
    assert "vision" in (client.show("vlm").capabilities or [])
    generated = client.generate(
        model="vlm", prompt=question["content"], images=[data], options=options
    )
    assert generated.prompt_eval_count == seen.prompt_eval_count

    llm = _chat_ollama(url, "vlm", num_predict=4)
    message = HumanMessage(
        content=[
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},
            {"type": "text", "text": question["content"]},
        ]
    )
    reply = llm.invoke([message])
    assert reply.usage_metadata and reply.usage_metadata["input_tokens"] > plain.prompt_eval_count

    with pytest.raises(ollama.ResponseError) as broken:
        client.chat(model="vlm", messages=[{**question, "images": ["bm90IGFuIGltYWdl" * 8]}])
    assert broken.value.status_code == 400
    assert "the base64 image data (128 characters) is not an image" in broken.value.error


# ----------------------------------------------------------- SmolLM2, LangChain


@pytest.mark.smollm
def test_chat_ollama_answers_streams_and_counts(smollm_url: str):
    llm = _chat_ollama(smollm_url, "smollm")
    reply = llm.invoke("What is the capital of France?")
    assert "Paris" in reply.content
    assert reply.response_metadata["done_reason"] in ("stop", "length")
    usage = reply.usage_metadata
    assert usage and usage["input_tokens"] > 10 and usage["output_tokens"] > 1
    chunks = list(llm.stream("What is the capital of France?"))
    assert len(chunks) > 2
    assert "".join(str(c.content) for c in chunks) == reply.content


@pytest.mark.smollm
def test_chat_ollama_tools_with_a_format_call_the_tool(smollm_url: str):
    """Tools and a format schema at once: each turn is calls (valid for their schemas)
    or the answer, as for an agent with a response format. SmolLM2 calls the tool."""
    llm = _chat_ollama(smollm_url, "smollm").bind_tools([get_weather])
    called = llm.invoke("What is the weather in Paris?", format=Capital.model_json_schema())
    assert called.tool_calls, called
    for call in called.tool_calls:
        assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)


@pytest.mark.smollm
def test_chat_ollama_structured_output_holds_to_the_schema(smollm_url: str):
    capital = _chat_ollama(smollm_url, "smollm").with_structured_output(Capital)
    answer = capital.invoke("What is the capital of France?")
    assert isinstance(answer, Capital) and answer.city == "Paris"


# ---------------------------------------------------------- SmolLM2, LlamaIndex


@pytest.mark.smollm
def test_llama_index_ollama_chats_streams_and_predicts_structures(smollm_url: str):
    from llama_index.core.llms import ChatMessage
    from llama_index.core.prompts import PromptTemplate
    from llama_index.llms.ollama import Ollama

    llm = Ollama(
        model="smollm",
        base_url=smollm_url,
        temperature=0,
        request_timeout=300,
        additional_kwargs={"repeat_penalty": 1.3, "num_predict": 64},
    )
    assert llm.metadata.context_window == 8192  # read from /api/show's model_info
    question = [ChatMessage(role="user", content="What is the capital of France?")]
    reply = llm.chat(question)
    assert "Paris" in (reply.message.content or "")
    streamed = list(llm.stream_chat(question))
    assert streamed[-1].message.content == reply.message.content
    answer = llm.structured_predict(
        Capital, PromptTemplate("What is the capital of {country}?"), country="France"
    )
    assert isinstance(answer, Capital) and answer.city == "Paris"


def test_ollama_llm_generates_through_api_generate(url: str):
    from langchain_ollama import OllamaLLM

    llm = OllamaLLM(base_url=url, model="vlm", temperature=0, num_predict=6)
    text = llm.invoke("Once upon a time")
    assert isinstance(text, str) and text
    assert "".join(llm.stream("Once upon a time")) == text
    same = ollama.Client(host=url).generate(
        model="vlm", prompt="Once upon a time", options={"temperature": 0, "num_predict": 6}
    )
    assert same.response == text
