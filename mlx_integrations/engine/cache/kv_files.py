"""KV cache files of the disk tier: safetensors that carry their token prefix.

One file holds the KV of one token prefix: per layer the keys and values cut to the
prefix (``"{layer}.k"``/``"{layer}.v"``, or ``"{layer}.k.{part}"`` for the packed values,
scales and biases of a quantized layer), and in the safetensors metadata what the file
is for: the format, the model's identity, the KV format (:func:`kv_format`), the cache
class of each layer, the dtype and the token ids. The name is a hash of the identity,
the KV format and the token ids (:func:`prefix_digests`), so a lookup needs no file.

The work is split by thread. :func:`snapshot` runs on the model's owner thread: it
evaluates the cut arrays (views of the cache's buffers, no copy) and exposes them to
NumPy without a copy either. :func:`write_file` runs on a writer thread and touches no
MLX call: it only reads those bytes. :func:`read_header` and :func:`check_entry` read and
check a file's header without MLX; :func:`build_cache` turns loaded arrays back into
mlx-lm cache layers, on the owner thread.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "mlxi-kv/1"
"""Written in every file; a file of another format is not loaded."""
BLOCK = 64
"""Prefix lengths hashed for lookups: every multiple of it, and each entry's own length."""
SUFFIX = ".safetensors"
PLAIN = "KVCache"
QUANTIZED = "QuantizedKVCache"
# Cache layers a file can hold: mlx-lm's plain and quantized caches (the quantized one
# that can join a batch too); rotating, chunked and state-space caches cannot be cut to
# a prefix.
_STORABLE = {
    "KVCache": PLAIN,
    "QuantizedKVCache": QUANTIZED,
    "MergeableQuantizedKVCache": QUANTIZED,
}
# mlx dtype name -> (safetensors tag, bytes per value). bfloat16 travels as its raw bits.
_DTYPES = {
    "float32": ("F32", 4),
    "float16": ("F16", 2),
    "bfloat16": ("BF16", 2),
    "uint32": ("U32", 4),
}
_ITEMSIZE = {tag: size for tag, size in _DTYPES.values()}
_MAX_HEADER = 64 * 1024 * 1024


class BadEntry(ValueError):
    """A file that is not a usable entry: damaged, of another format or KV format."""


class ForeignEntry(BadEntry):
    """A file made for another model (its identity differs)."""


def kv_format(kv_bits: int | None, group_size: int, quantized_kv_start: int) -> str:
    """The KV format tag of an engine: ``"kv"`` for a plain cache, ``"kv8g64s0"`` for
    8 bits in groups of 64 quantized from token 0. Entries serve only their own format."""
    if kv_bits is None:
        return "kv"
    return f"kv{kv_bits}g{group_size}s{quantized_kv_start}"


def prefix_digests(seed: bytes, tokens: Sequence[int], lengths: Iterable[int]) -> dict[int, bytes]:
    """The hash of ``seed`` and the first ``n`` token ids, for each ``n`` of ``lengths``.

    One running hash over the ids: the cost is that of hashing the longest prefix once.
    """
    import numpy as np

    wanted = sorted({n for n in lengths if 0 < n <= len(tokens)})
    if not wanted:
        return {}
    raw = np.asarray(tokens[: wanted[-1]], dtype="<u4").tobytes()
    h = hashlib.blake2b(seed, digest_size=16)
    out: dict[int, bytes] = {}
    done = 0
    for n in wanted:
        h.update(raw[done * 4 : n * 4])
        done = n
        out[n] = h.digest()
    return out


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def lookup_lengths(n: int) -> list[int]:
    """The prefix lengths an entry of ``n`` tokens is found by: block multiples and ``n``."""
    return [*range(BLOCK, n + 1, BLOCK), n]


def storable_classes(cache: list[Any]) -> list[str] | None:
    """The file class of each layer, or None when a layer cannot be stored."""
    names = [_STORABLE.get(type(layer).__name__) for layer in cache]
    if not cache or any(n is None for n in names):
        return None
    return [n for n in names if n is not None]


@dataclass
class Snapshot:
    """The KV of one prefix, ready for the writer thread.

    ``views`` are NumPy views of MLX buffers; ``keep`` holds those MLX arrays, so the
    buffers live (and no MLX step writes into them: a buffer still referenced is never
    reused in place) until the owner thread lets them go after the write.
    """

    name: str
    tokens: tuple[int, ...]
    metadata: dict[str, str]
    views: list[tuple[str, str, Any]]  # (tensor name, safetensors dtype, NumPy view)
    keep: list[Any] = field(repr=False)
    nbytes: int = 0


def snapshot(
    cache: list[Any], tokens: Sequence[int], name: str, metadata: dict[str, str]
) -> Snapshot:
    """Views of the KV of ``tokens``, the first tokens ``cache`` holds (owner thread).

    Raises:
        BadEntry: A layer holds fewer than ``n`` tokens, a batch, or an unknown dtype.
    """
    import mlx.core as mx
    import numpy as np

    n = len(tokens)
    names: list[str] = []
    parts: list[Any] = []
    tags: list[str] = []
    for i, layer in enumerate(cache):
        if layer.keys is None or layer.offset < n:
            raise BadEntry(f"layer {i} holds {layer.offset} tokens, fewer than {n}")
        quantized = isinstance(layer.keys, tuple)
        for side, value in (("k", layer.keys), ("v", layer.values)):
            for j, x in enumerate(value if quantized else (value,)):
                if x.shape[0] != 1 or x.ndim != 4:
                    raise BadEntry(f"layer {i} is not one sequence's cache: {x.shape}")
                tag = _DTYPES.get(str(x.dtype).rpartition(".")[2], ("", 0))[0]
                if not tag:
                    raise BadEntry(f"layer {i} holds {x.dtype}, which is not stored")
                x = x[..., :n, :]
                parts.append(x.view(mx.uint16) if tag == "BF16" else x)
                names.append(f"{i}.{side}.{j}" if quantized else f"{i}.{side}")
                tags.append(tag)
    mx.eval(parts)
    views = [
        (nm, tag, np.array(x, copy=False)) for nm, tag, x in zip(names, tags, parts, strict=True)
    ]
    nbytes = sum(v.nbytes for _, _, v in views)
    return Snapshot(name, tuple(tokens), metadata, views, parts, nbytes)


def write_file(path: Path, snap: Snapshot) -> None:
    """Write ``snap`` as a safetensors file at ``path`` and sync it (no MLX call)."""
    import numpy as np

    header: dict[str, Any] = {}
    offset = 0
    for name, tag, view in snap.views:
        header[name] = {
            "dtype": tag,
            "shape": list(view.shape),
            "data_offsets": [offset, offset + view.nbytes],
        }
        offset += view.nbytes
    header["__metadata__"] = snap.metadata
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as fh:
        fh.write(len(raw).to_bytes(8, "little"))
        fh.write(raw)
        for _, _, view in snap.views:
            fh.write(np.ascontiguousarray(view).data)
        fh.flush()
        os.fsync(fh.fileno())


def read_header(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The tensors (name -> dtype, shape, offsets) and metadata of a file's header.

    Raises:
        BadEntry: Not a whole safetensors file (cut short, a bad header).
        OSError: The file cannot be read.
    """
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < length <= min(size - 8, _MAX_HEADER):
            raise BadEntry(f"no safetensors header ({size} bytes)")
        try:
            header = json.loads(fh.read(length))
        except (UnicodeDecodeError, ValueError) as exc:
            raise BadEntry(f"a header that is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise BadEntry("a header that is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise BadEntry("no metadata")
    end = 0
    for name, info in header.items():
        try:
            shape, (start, stop) = [int(d) for d in info["shape"]], info["data_offsets"]
            if stop - start != math.prod(shape) * _ITEMSIZE[info["dtype"]] or start < 0:
                raise ValueError("offsets and shape disagree")
        except (KeyError, TypeError, ValueError) as exc:
            raise BadEntry(f"tensor {name!r}: {exc!r}") from None
        end = max(end, stop)
    if 8 + length + end != size:
        raise BadEntry(f"{size} bytes where the header describes {8 + length + end} (cut short?)")
    return header, metadata


def metadata_tokens(metadata: dict[str, str]) -> list[int]:
    """The token ids a file's metadata names."""
    try:
        tokens = json.loads(metadata["tokens"])
    except (KeyError, ValueError):
        raise BadEntry("no token ids in the metadata") from None
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        raise BadEntry("token ids that are not a list of integers")
    return tokens


def check_entry(
    stem: str,
    tensors: dict[str, Any],
    metadata: dict[str, str],
    identity: str,
    kv: str,
    seed: bytes,
) -> list[int]:
    """Check a file's header against what the engine serves; return its token ids.

    Raises:
        ForeignEntry: The file was made for other weights.
        BadEntry: Another format or KV format, a name that is not the hash of the token
            ids, or tensors whose names or shapes do not fit the classes and prefix.
    """
    if metadata.get("format") != FORMAT:
        raise BadEntry(f"format {metadata.get('format')!r}, not {FORMAT!r}")
    if metadata.get("identity") != identity:
        raise ForeignEntry(f"made for another model ({metadata.get('identity', '')[:16]}...)")
    if metadata.get("kv") != kv:
        raise BadEntry(f"KV format {metadata.get('kv')!r}, not {kv!r}")
    tokens = metadata_tokens(metadata)
    n = len(tokens)
    if not tokens or prefix_digests(seed, tokens, [n])[n].hex() != stem:
        raise BadEntry("a name that is not the hash of its token ids")
    try:
        classes = json.loads(metadata["classes"])
    except (KeyError, ValueError):
        raise BadEntry("no cache classes in the metadata") from None
    if QUANTIZED in classes and not kv.startswith(
        f"kv{metadata.get('kv_bits')}g{metadata.get('kv_group_size')}s"
    ):
        raise BadEntry("quantized layers whose bits or group size are not the KV format's")
    expected: set[str] = set()
    for i, cls in enumerate(classes):
        if cls == PLAIN:
            expected |= {f"{i}.k", f"{i}.v"}
        elif cls == QUANTIZED and kv != "kv":
            expected |= {f"{i}.{side}.{j}" for side in "kv" for j in range(3)}
        else:
            raise BadEntry(f"layer {i} of class {cls!r}")
    if set(tensors) != expected:
        raise BadEntry(f"tensors {sorted(set(tensors) ^ expected)[:4]} do not fit the classes")
    for name, info in tensors.items():
        shape = info["shape"]
        if len(shape) != 4 or shape[0] != 1 or shape[2] != n:
            raise BadEntry(f"tensor {name!r} of shape {shape} for {n} tokens")
    return tokens


def build_cache(arrays: dict[str, Any], metadata: dict[str, str]) -> list[Any]:
    """mlx-lm cache layers from a loaded file's arrays (owner thread)."""
    from mlx_lm.models.cache import KVCache

    from mlx_integrations.engine.batched.kv_cache import MergeableQuantizedKVCache

    n = len(metadata_tokens(metadata))
    layers: list[Any] = []
    for i, cls in enumerate(json.loads(metadata["classes"])):
        layer: Any
        if cls == PLAIN:
            layer = KVCache()
            layer.keys, layer.values = arrays[f"{i}.k"], arrays[f"{i}.v"]
        else:  # a quantized layer that can also join a batch
            bits, group = int(metadata["kv_bits"]), int(metadata["kv_group_size"])
            layer = MergeableQuantizedKVCache(group_size=group, bits=bits)
            layer.keys = tuple(arrays[f"{i}.k.{j}"] for j in range(3))
            layer.values = tuple(arrays[f"{i}.v.{j}"] for j in range(3))
        layer.offset = n
        layers.append(layer)
    return layers
