"""Pack the wheels and test models for the GPU machine into bundles that fit one call.

Each call to the GPU machine carries at most 64 MiB, counting the working tree that
travels with it (tracked files, untracked files git does not ignore, and the carried
paths), so what it lacks travels over several calls: ``.gpu/1``, ``.gpu/2``... each
hold whole small files and pieces of large ones (``NAME.part-NN``), filled in order:
MLX and its CUDA backend first, then the suite's wheels, then the test models
(SmolLM2's GGUF and all-MiniLM-L6-v2, as one ``models.tar.xz``). ``SHA256SUMS`` (in
every bundle) names each whole file and ``PARTS`` the number of pieces of each file cut;
``bench/gpu/device.sh`` joins the pieces there once all have come, and checks them. A bundle holds 64 MiB less the working tree as it is now, less
``--headroom-mib`` for what the tree gains before the calls (``--check`` says whether
it still fits).

Run ``bench/gpu/download.sh`` first, and once the test models are in the local test
cache (any local run of the smollm and embedding tests puts them there)::

    python bench/gpu/pack.py            # prints the bundles and the calls they take
    python bench/gpu/pack.py --check    # right before the calls: do they still fit?

A bundle is carried from a folder of this repository that git ignores (``.gpu/`` is);
``--out`` elsewhere packs there, to be copied into such a folder.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.minilm import VERSION as MINILM_VERSION  # noqa: E402
from tests.support.smollm import GGUF_NAME, cache_dir  # noqa: E402

MIB = 1 << 20
CALL_LIMIT = 64 * MIB
"""What one call to the GPU machine carries: the working tree and the carried paths."""
FIRST = ("mlx_cuda", "mlx-", "mlx_lm")
"""Wheels packed before the others, so MLX is whole after the fewest calls."""


def _git_files(root: Path, *args: str) -> list[Path]:
    out = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", *args],
        capture_output=True,
        check=True,
    ).stdout
    return [root / name for name in out.decode().split("\0") if name]


def travelling_bytes(root: Path = ROOT) -> int:
    """Bytes of the working tree a call carries besides its carried paths: tracked files
    (as they are on disk), untracked files git does not ignore, and ``shared/``."""
    files = set(_git_files(root)) | set(_git_files(root, "--others", "--exclude-standard"))
    shared = root / "shared"
    if shared.is_dir():
        files |= {p for p in shared.rglob("*") if p.is_file()}
    return sum(p.lstat().st_size for p in files if p.is_file() or p.is_symlink())


def bundle_capacity(tree: int, headroom: int) -> int:
    """Bytes a bundle may hold: the call's limit less the tree and the headroom."""
    capacity = CALL_LIMIT - tree - headroom
    if capacity < 8 * MIB:
        raise SystemExit(
            f"Error: the working tree that travels is {tree / MIB:.1f} MiB; with "
            f"{headroom / MIB:.1f} MiB of headroom a bundle would hold {capacity / MIB:.1f} "
            "MiB. Hint: ignore or remove the large untracked files (git status)"
        )
    return capacity


def shown(path: Path) -> str:
    """``path`` relative to the repository where it lies inside it, else absolute."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def is_ignored(path: Path) -> bool:
    """Whether git ignores ``path`` (inside the repository), so it travels only carried."""
    done = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "-q", str(path)], capture_output=True
    )
    return done.returncode == 0


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


def pack(files: list[Path], out: Path, capacity: int) -> tuple[list[Path], dict[str, int]]:
    """Fill bundles ``out/1``, ``out/2``... in order, each to ``capacity``.

    A file that does not fit in what is left of a bundle is cut into pieces
    (``NAME.part-NN``) that go on in the next bundles. Returns the bundles and, for each
    file cut, its number of pieces (``device.sh`` installs a wheel once all are there).
    """
    bundles: list[Path] = []
    pieces: dict[str, int] = {}
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
        if not bundles or left == 0:
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
        pieces[path.name] = part
    return bundles, pieces


def bundles_in(out: Path) -> list[Path]:
    return sorted(
        (p for p in out.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
    )


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def check(out: Path, headroom: int) -> int:
    """Exit status 1 if a call carrying the largest bundle would pass the limit now."""
    tree = travelling_bytes()
    bundles = bundles_in(out) if out.is_dir() else []
    if not bundles:
        print(f"Error: no bundles in {shown(out)}; run bench/gpu/pack.py", file=sys.stderr)
        return 1
    largest = max(folder_bytes(b) for b in bundles)
    total = tree + largest
    print(
        f"working tree {tree / MIB:.2f} MiB + largest bundle {largest / MIB:.2f} MiB = "
        f"{total / MIB:.2f} MiB of {CALL_LIMIT / MIB:.0f} ({(CALL_LIMIT - total) / MIB:.2f} MiB left)"
    )
    if total > CALL_LIMIT - headroom // 4:
        print(
            "Error: a call would carry too much. Hint: pack again "
            "(python bench/gpu/pack.py), or ignore the large untracked files",
            file=sys.stderr,
        )
        return 1
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu", help="where the bundles go")
    parser.add_argument(
        "--wheels", type=Path, help="the downloaded wheels (default: OUT/wheels, else .gpu/wheels)"
    )
    parser.add_argument(
        "--bundle-mib",
        type=float,
        help="bytes per bundle, in MiB (default: 64 less the working tree and the headroom)",
    )
    parser.add_argument(
        "--headroom-mib",
        type=float,
        default=2.0,
        help="MiB left free in each call for files the tree gains before the calls",
    )
    parser.add_argument("--no-models", action="store_true", help="wheels only")
    parser.add_argument(
        "--check", action="store_true", help="only check that the bundles still fit a call"
    )
    args = parser.parse_args()
    out = args.out.resolve()
    headroom = int(args.headroom_mib * MIB)
    if args.check:
        raise SystemExit(check(out, headroom))

    wheels_dir = args.wheels or (out / "wheels")
    if args.wheels is None and not wheels_dir.is_dir():
        wheels_dir = ROOT / ".gpu" / "wheels"
    wheels = order(sorted(wheels_dir.glob("*.whl")))
    if not any(w.name.startswith("mlx_cuda") for w in wheels):
        raise SystemExit(
            f"Error: no mlx-cuda wheel in {shown(wheels_dir)}; run bench/gpu/download.sh"
        )
    tree = travelling_bytes()
    if args.bundle_mib is not None:
        capacity = int(args.bundle_mib * MIB)
    else:
        capacity = bundle_capacity(tree, headroom)
    out.mkdir(parents=True, exist_ok=True)
    files = list(wheels)
    if not args.no_models:
        files.append(models_archive(out))
    for old in bundles_in(out):
        shutil.rmtree(old)
    sums = "".join(f"{sha256(p)}  {p.name}\n" for p in files)
    # What is written beside the files comes out of the first bundle's share.
    bundles, pieces = pack(files, out, capacity - 64 * 1024)
    for folder in bundles:
        (folder / "SHA256SUMS").write_text(sums)
        (folder / "PARTS").write_text("".join(f"{name} {n}\n" for name, n in pieces.items()))
    largest = 0
    for folder in bundles:
        size = folder_bytes(folder)
        largest = max(largest, size)
        print(f"{shown(folder)}  {size / MIB:5.1f} MiB  {len(list(folder.iterdir()))} files")
    print(
        f"{len(bundles)} calls carry it all: one per bundle, in order; the working tree "
        f"travels with each ({tree / MIB:.2f} MiB now): {(tree + largest) / MIB:.2f} MiB in "
        f"the largest call, {(CALL_LIMIT - tree - largest) / MIB:.2f} MiB under the limit"
    )
    if not out.is_relative_to(ROOT):
        print(
            f"Note: {out} is outside the repository; a call carries a folder of the "
            "repository that git ignores: copy the bundles into one (as .gpu/) first"
        )
    elif not is_ignored(out):
        print(
            f"Warning: git does not ignore {shown(out)}: its bundles would travel with every "
            f"call. Hint: echo /{shown(out)}/ >> .git/info/exclude",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
