"""KV caches kept between requests and within them.

- :mod:`.prefix_cache`: the KV of earlier prompts under a memory budget, found by the
  longest shared token prefix;
- :mod:`.kv_quantization`: a quantized KV cache (``kv_bits``): options, checks and the
  in-place conversion.
"""
