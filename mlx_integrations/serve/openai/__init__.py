"""OpenAI's endpoints on ``mlxi serve``: each request model to the chat core and back.

- :mod:`.chat`: ``POST /v1/chat/completions``;
- :mod:`.completions`: ``POST /v1/completions`` (raw text);
- :mod:`.responses`: ``POST /v1/responses`` (stateless), :mod:`.custom_tools`: its
  freeform tools, :mod:`.lark_regex`: their regular Lark grammars as patterns;
- :mod:`.embeddings`: ``POST /v1/embeddings``; :mod:`.models`: ``GET /v1/models``.
"""
