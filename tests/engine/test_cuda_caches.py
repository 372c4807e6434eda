"""MLX's CUDA caches missing more often than their size, in a long-lived engine (CUDA only).

MLX keeps cuDNN attention plans in a cache per thread, keyed by the exact shapes of an
attention; with its thrashing check on, a cache that has missed twice its size raises on
every later miss. ``import mlx_integrations`` turns the check off unless
``MLX_ENABLE_CACHE_THRASHING_CHECK`` is set (``let_caches_miss``): an engine that meets
more attention shapes than that (every new prompt length, batch size or key length is
one) pays the set-up again and keeps serving.

Each case runs in a fresh process, since MLX reads the variables as it makes a cache (an
owner thread reused from an earlier engine would keep its own).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_integrations.engine.decoding import cuda_default_device
from mlx_integrations.runtime import CACHE_CHECK_VARIABLE
from tests.support.tiny_models import build_tiny_model

pytestmark = pytest.mark.skipif(
    not cuda_default_device(), reason="MLX's CUDA caches (the GPU runs on CUDA)"
)

SERVE = """
import asyncio, sys
import mlx_integrations
from mlx_integrations.engine import BatchedEngine, SimpleEngine

async def main(path, kind):
    engine = {"simple": SimpleEngine, "batched": BatchedEngine}[kind](
        path, cache_memory_mb=0, prefill_buckets=False, warmup_shapes=False
    )
    await engine.start()
    served = 0
    try:
        for n in range(12):  # 12 prompt lengths: an attention shape each, 3x the limit
            out = await engine.generate(" ".join(["word"] * (3 + 5 * n)), max_tokens=3,
                                        temperature=0.0)
            assert out.prompt_tokens > 0 and 1 <= out.completion_tokens <= 3
            served += 1
    except Exception as exc:
        print("failed:", exc, flush=True)
    print("served", served, flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.fixture(scope="module")
def tiny_bf16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model in bfloat16 (head size 16), whose prefill attention runs on cuDNN."""
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny-bf16"), dtype="bfloat16", tie_word_embeddings=False
    )


def serve(path: Path, kind: str, check: str | None) -> str:
    """Run SERVE in a fresh process with two attention plans a thread; ``check``: the
    thrashing check's variable (None: unset, the package's default)."""
    env = {k: v for k, v in os.environ.items() if k != CACHE_CHECK_VARIABLE}
    env["MLX_CUDA_SDPA_CACHE_SIZE"] = "2"
    if check is not None:
        env[CACHE_CHECK_VARIABLE] = check
    done = subprocess.run(
        [sys.executable, "-c", SERVE, str(path), kind],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # Exit status aside: MLX may abort at exit after its check fired.
    return done.stdout + done.stderr


@pytest.mark.parametrize("kind", ["simple", "batched"])
def test_an_engine_meeting_more_attention_shapes_than_mlx_caches_keeps_serving(
    tiny_bf16: Path, kind: str
) -> None:
    out = serve(tiny_bf16, kind, None)
    assert "served 12" in out and "failed:" not in out, out[-2000:]
    # With MLX's check on (its own default), the same requests fail: the test meets the
    # case the default spares.
    out = serve(tiny_bf16, kind, "1")
    assert "Cache thrashing is happening" in out and "served 12" not in out, out[-2000:]
