"""``BatchedEngine``: continuous batching on mlx-lm's ``BatchGenerator``.

- :mod:`.engine`: the engine: admission, the owner thread's serve loop, joins and leaves;
- :mod:`.solo`: a request that runs alone, on a plain KV cache, until others join;
- :mod:`.sampling`: per-row samplers and logits processors of the shared batch;
- :mod:`.kv_cache`: the shared batch's quantized KV cache (``kv_bits``);
- :mod:`.speculation`: drafting for the rows of the shared batch (prompt lookup or a
  draft model), verified in one wide step;
- :mod:`.draft_model`: the draft model's own batch KV cache, row for row.
"""
