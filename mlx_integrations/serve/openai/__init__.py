"""OpenAI's endpoints on ``mlxi serve``: each request model to the chat core and back.

- :mod:`.chat`: ``POST /v1/chat/completions``;
- :mod:`.completions`: ``POST /v1/completions`` (raw text);
- :mod:`.responses`: ``POST /v1/responses``, :mod:`.response_store`: the responses
  kept for ``previous_response_id``, :mod:`.custom_tools`: its freeform tools,
  :mod:`.lark_regex`: their regular Lark grammars as patterns;
- :mod:`.logprobs`: which tokens a reply's ``logprobs`` list;
- :mod:`.embeddings`: ``POST /v1/embeddings``; :mod:`.models`: ``GET /v1/models``.
"""
