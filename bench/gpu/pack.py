"""Pack the wheels and test models for the GPU machine into bundles that fit one call.

Each call to the GPU machine carries at most 64 MiB (the working tree included), so
what it lacks travels over several calls: ``.gpu/1``, ``.gpu/2``... each hold whole
small files and pieces of large ones (``NAME.part-NN``), filled in order: MLX and its
CUDA backend first, then the suite's wheels, then the test models (SmolLM2's GGUF and
all-MiniLM-L6-v2, as one ``models.tar.xz``). ``SHA256SUMS`` (in every bundle) names
each whole file; ``bench/gpu/device.sh`` joins the pieces there and checks them.

Run ``bench/gpu/download.sh`` first, and once the test models are in the local test
cache (any local run of the smollm and embedding tests puts them there)::

    .venv/bin/python bench/gpu/pack.py            # prints how many calls it takes
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.minilm import VERSION as MINILM_VERSION  # noqa: E402
from tests.support.smollm import GGUF_NAME, cache_dir  # noqa: E402

MIB = 1 << 20
FIRST = ("mlx_cuda", "mlx-", "mlx_lm")
"""Wheels packed before the others, so MLX is whole after the fewest calls."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(MIB), b""):
            digest.update(chunk)
    return digest.hexdigest()


def models_archive(out: Path) -> Path:
    """``models.tar.xz``: the SmolLM2 GGUF and the MiniLM folder, as the test cache holds them."""
    cache = cache_dir()
    gguf = cache / GGUF_NAME
    minilm = cache / f"all-MiniLM-L6-v2-{MINILM_VERSION}"
    missing = [str(p) for p in (gguf, minilm) if not p.exists()]
    if missing:
        raise SystemExit(
            f"Error: {', '.join(missing)} not found; run the smollm and embedding tests "
            "once here (they download both), then pack again"
        )
    archive = out / "models.tar.xz"
    if not archive.exists():
        tmp = out / ".models.tar.xz.tmp"
        with tarfile.open(tmp, "w:xz", preset=1) as tar:
            tar.add(gguf, arcname=gguf.name)
            tar.add(minilm, arcname=minilm.name)
        os.replace(tmp, archive)
    return archive


def order(wheels: list[Path]) -> list[Path]:
    def rank(p: Path) -> tuple[int, str]:
        first = [i for i, prefix in enumerate(FIRST) if p.name.startswith(prefix)]
        return (first[0] if first else len(FIRST), p.name)

    return sorted(wheels, key=rank)


def pack(files: list[Path], out: Path, capacity: int) -> list[Path]:
    """Fill bundles ``out/1``, ``out/2``... in order; split a file only where it must be.

    A file that does not fit in what is left of a bundle starts the next one, unless it
    is larger than a whole bundle or would leave more than a quarter of this one empty:
    then it is cut into pieces.
    """
    bundles: list[Path] = []
    left = 0

    def new_bundle() -> Path:
        nonlocal left
        folder = out / str(len(bundles) + 1)
        folder.mkdir()
        bundles.append(folder)
        left = capacity
        return folder

    for path in files:
        size = path.stat().st_size
        if not bundles or (size > left and size <= capacity and left < capacity // 4):
            new_bundle()
        if size <= left:
            shutil.copy2(path, bundles[-1] / path.name)
            left -= size
            continue
        with path.open("rb") as src:
            part, remaining = 0, size
            while remaining:
                if left == 0:
                    new_bundle()
                n = min(left, remaining)
                (bundles[-1] / f"{path.name}.part-{part:02d}").write_bytes(src.read(n))
                left, remaining, part = left - n, remaining - n, part + 1
    return bundles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu")
    parser.add_argument(
        "--bundle-mib",
        type=float,
        default=61.0,
        help="bytes per bundle, in MiB (64 less the working tree, about 2)",
    )
    parser.add_argument("--no-models", action="store_true", help="wheels only")
    args = parser.parse_args()

    wheels = order(sorted((args.out / "wheels").glob("*.whl")))
    if not any(w.name.startswith("mlx_cuda") for w in wheels):
        raise SystemExit("Error: no mlx-cuda wheel in .gpu/wheels; run bench/gpu/download.sh")
    files = list(wheels)
    if not args.no_models:
        files.append(models_archive(args.out))
    for old in args.out.iterdir():
        if old.is_dir() and old.name.isdigit():
            shutil.rmtree(old)
    sums = "".join(f"{sha256(p)}  {p.name}\n" for p in files)
    bundles = pack(files, args.out, int(args.bundle_mib * MIB))
    for folder in bundles:
        (folder / "SHA256SUMS").write_text(sums)
        size = sum(p.stat().st_size for p in folder.iterdir())
        print(
            f"{folder.relative_to(ROOT)}  {size / MIB:5.1f} MiB  {len(list(folder.iterdir()))} files"
        )
    print(f"{len(bundles)} calls carry it all: one per bundle, in order")


if __name__ == "__main__":
    main()
