"""The wire formats' requests and replies as Pydantic models (as vLLM's ``protocol.py``).

- :mod:`.base`: lenient requests, the fields they report as ignored, error paths;
- :mod:`.openai`: chat completions, completions, embeddings, models;
- :mod:`.responses`: the Responses API;
- :mod:`.anthropic`: the Messages API.

The server's OpenAPI schema (``/openapi.json``, ``/docs``) is generated from them.
"""
