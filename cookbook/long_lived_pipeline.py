"""A long-lived pipeline that keeps memory bounded: watch get_stats(), clear caches.

Each request leaves its prompt's KV cache behind so the next turn of the same
conversation prefills only what is new. A service that handles many unrelated
conversations should drop those caches from time to time; the engine also keeps them
within `cache_memory_mb` on its own.

Run: python cookbook/long_lived_pipeline.py
"""

from __future__ import annotations

from example_model import example_model

from mlx_integrations.langchain import ChatMLX

TOPICS = ["the sea", "mountains", "a city at night", "autumn", "a library", "the moon"]


def main() -> None:
    llm = ChatMLX(
        model=example_model(),
        temperature=0.7,
        max_tokens=24,
        engine_options={"cache_memory_mb": 256},
    )
    for i, topic in enumerate(TOPICS, 1):
        llm.invoke(f"Write one short line about {topic}.")
        stats = llm.get_stats()
        cache = stats["prefix_cache"]
        print(
            f"request {i}: {cache['entry_count']} cached prompts, "
            f"{cache['current_memory_mb']:.1f} MiB KV, "
            f"MLX buffer pool {stats['memory']['cache_mb']:.1f} MiB"
        )
        if i % 3 == 0:  # e.g. every N requests, or when memory passes a threshold
            freed = llm.clear_runtime_caches()
            print(
                f"  cleared: {freed['dropped_entries']} prompts, {freed['freed_cache_mb']:.1f} MiB "
                f"KV, {freed['freed_buffer_pool_mb']:.1f} MiB buffer pool"
            )


if __name__ == "__main__":
    main()
