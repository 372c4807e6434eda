"""mlx-vlm's global patches leave text models alone; a VLM folder loads offline."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mlx_integrations.engine import SimpleEngine

_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    import mlx_integrations
    from mlx_integrations.engine import SimpleEngine

    TEXT, VLM, IMAGE = sys.argv[1:4]
    MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]

    async def text_tokens():
        engine = SimpleEngine(TEXT)
        out = await engine.chat(MESSAGES, max_tokens=12, temperature=0)
        await engine.stop()
        return out.tokens

    async def main():
        assert "mlx_vlm" not in sys.modules
        before = await text_tokens()
        vlm = SimpleEngine(VLM)
        parts = [{"type": "image", "image": IMAGE}, {"type": "text", "text": "Describe."}]
        await vlm.chat([{"role": "user", "content": parts}], max_tokens=4, temperature=0)
        assert "mlx_vlm" in sys.modules
        after = await text_tokens()
        await vlm.stop()
        print(json.dumps({"before": before, "after": after}))

    asyncio.run(main())
    """
)


def test_a_text_model_replies_the_same_after_a_vlm_loads(
    tiny_qwen2: Path, tiny_vlm: Path, test_images: tuple[Path, Path]
) -> None:
    # A fresh process: importing mlx_vlm patches transformers' AutoProcessor for good.
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tiny_qwen2), str(tiny_vlm), str(test_images[0])],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["before"] and result["after"] == result["before"]


async def test_a_vlm_without_processor_config_loads_offline(
    tiny_vlm: Path, test_images: tuple[Path, Path], tmp_path: Path, monkeypatch
) -> None:
    import huggingface_hub

    bare = tmp_path / "bare-vlm"
    shutil.copytree(tiny_vlm, bare)
    for name in ("processor_config.json", "video_preprocessor_config.json"):
        (bare / name).unlink()
    asked: list[str] = []
    real = huggingface_hub.hf_hub_download

    def spy(repo_id, *args, **kwargs):
        asked.append(str(repo_id))
        return real(repo_id, *args, **kwargs)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", spy)
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": str(test_images[0])},
                {"type": "text", "text": "Hi"},
            ],
        }
    ]
    replies = []
    for folder in (bare, tiny_vlm):
        engine = SimpleEngine(folder)
        try:
            replies.append(await engine.chat(messages, max_tokens=6, temperature=0))
        finally:
            await engine.stop()
    assert replies[0].tokens == replies[1].tokens
    assert replies[0].prompt_tokens == replies[1].prompt_tokens
    # The processor looks for the missing files under the folder's absolute path, which
    # the Hub client refuses as a repository id before any request is made.
    assert asked and all(Path(repo).is_absolute() for repo in asked)


def test_missing_mlx_vlm_names_the_extra(tiny_vlm: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "mlx_vlm", None)  # as if not installed
    engine = SimpleEngine(tiny_vlm)
    assert engine.is_mllm
    with pytest.raises(ImportError, match=r'pip install "mlx-integrations\[vision\]"'):
        engine.prepare_for_start()
    assert not engine.is_loaded
