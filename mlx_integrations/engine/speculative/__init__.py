"""Speculative decoding: drafts from a small model or from the context, verified in one pass.

- :mod:`.prompt_lookup`: drafts looked up in the prompt and the reply so far;
- :mod:`.draft_model`: drafts from a second, smaller model of the same vocabulary;
- :mod:`.pace`: whether a wide (verifying) step or a plain one emits tokens faster here.

Both sources keep the tokens plain decoding gives (greedy), or the target's own
distribution (sampled). The requests of ``BatchedEngine``'s shared batch draft through
:mod:`mlx_integrations.engine.batched.speculation`.
"""
