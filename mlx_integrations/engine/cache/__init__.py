"""KV caches kept between requests and within them.

- :mod:`.prefix_cache`: the KV of earlier prompts under a memory budget, found by the
  longest shared token prefix;
- :mod:`.disk`: the optional disk tier under it (``cache_dir``), which outlives the
  process; :mod:`.kv_files` is its file format, :mod:`.disk_warm` fills it ahead of time;
- :mod:`.kv_quantization`: a quantized KV cache (``kv_bits``): options, checks and the
  in-place conversion;
- :mod:`.kv_estimate`: what a request's KV cache will take, from the model's config,
  for admission before it runs;
- :mod:`.cut`: a cached prefix served in whole key steps (where prefill pieces are
  padded, CUDA by default).
"""
