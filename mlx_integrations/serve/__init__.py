"""``mlxi serve``: the engines behind OpenAI-, Anthropic- and Ollama-compatible HTTP endpoints.

Each wire format is translated into the chat-core call the adapters make
(:func:`~mlx_integrations.chat.completion.stream_chat_events`), so tool calls (their
``tool_choice`` enforced by constrained decoding), JSON schemas, reasoning and usage
behave the same in-process and over HTTP.

- :mod:`.protocol`: each endpoint's request and reply as Pydantic models (the
  OpenAPI schema is generated from them);
- :mod:`.config`: the server's settings and each model's engine (a TOML/JSON file);
- :mod:`.registry`: a request's model name to its pooled engine;
- :mod:`.state`: what the handlers share, and the chat turn every format ends in;
- :mod:`.openai`: OpenAI's endpoints (chat, completions, responses, embeddings,
  models); :mod:`.anthropic`: Anthropic's Messages API; :mod:`.ollama`: Ollama's API;
  :mod:`.rerank`: Jina's and Cohere's rerank endpoints;
- :mod:`.app`: routes, the API key, body limits, draining; :mod:`.server`: uvicorn;
- :mod:`.paths`, :mod:`.errors`, :mod:`.replies`, :mod:`.sse`, :mod:`.metrics`: field
  paths in each API's names, error shapes, replies and the ignored-fields header,
  events, Prometheus figures.

Needs the ``[serve]`` extra (FastAPI and uvicorn); importing this package imports
neither until a name below is used.
"""

from mlx_integrations.lazy_imports import lazy_attributes

__all__ = [
    "BackgroundServer",
    "ModelConfig",
    "ServeConfig",
    "create_app",
    "serve",
]

__getattr__ = lazy_attributes(
    __name__,
    {
        "BackgroundServer": "mlx_integrations.serve.server",
        "ModelConfig": "mlx_integrations.serve.config",
        "ServeConfig": "mlx_integrations.serve.config",
        "create_app": "mlx_integrations.serve.app",
        "serve": "mlx_integrations.serve.server",
    },
)
