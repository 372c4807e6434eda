"""Read the header of a GGUF file (llama.cpp's format): metadata and tensor table.

Only the header is parsed; tensor data is left to ``mx.load``, which decodes the types
listed in :data:`TENSOR_TYPES`. A truncated or damaged file is reported with its size
and where it ends, before any tensor is read.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["TENSOR_TYPES", "GGUFHeader", "GGUFTensorInfo", "read_gguf_header"]

GGUF_MAGIC = b"GGUF"
# ggml tensor types that mx.load decodes: id -> (name, values per block, bytes per block).
TENSOR_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    8: ("Q8_0", 32, 34),
}
# Names of the other ggml types, only to say which one a file uses.
# fmt: off
_OTHER_TENSOR_TYPES = {
    6: "Q5_0", 7: "Q5_1", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K",
    14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S",
    20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32",
    27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16",
}
# fmt: on
# GGUF metadata value types -> struct format (scalars) or a tag.
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
_SCALAR_FORMATS.update({10: "<Q", 11: "<q", 12: "<d"})
_STRING, _ARRAY = 8, 9
_NUMPY_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4"}
_NUMPY_DTYPES.update({7: "?", 10: "<u8", 11: "<i8", 12: "<f8"})


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor entry of a GGUF header.

    Attributes:
        name: GGUF tensor name, e.g. ``blk.0.attn_q.weight``.
        shape: Shape in MLX (row-major) order; GGUF stores it reversed.
        type_id: ggml type id (0 F32, 1 F16, 2 Q4_0, 3 Q4_1, 8 Q8_0, ...).
        offset: Byte offset of the data, relative to the start of the data section.
    """

    name: str
    shape: tuple[int, ...]
    type_id: int
    offset: int

    @property
    def type_name(self) -> str:
        """The ggml type name, e.g. ``Q4_1``."""
        if self.type_id in TENSOR_TYPES:
            return TENSOR_TYPES[self.type_id][0]
        return _OTHER_TENSOR_TYPES.get(self.type_id, f"type {self.type_id}")


@dataclass(frozen=True)
class GGUFHeader:
    """Metadata and tensor table of a GGUF file, read without touching tensor data.

    Attributes:
        path: The file.
        version: GGUF format version (2 or 3).
        metadata: Key/value metadata with plain Python values (str, int, float, bool, list).
        tensors: Tensor entries by name, in file order.
        data_offset: Absolute byte offset of the tensor data section.
        file_size: Size of the file in bytes.
    """

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensorInfo] = field(repr=False)
    data_offset: int
    file_size: int

    @property
    def architecture(self) -> str | None:
        """``general.architecture``, e.g. ``llama``."""
        value = self.metadata.get("general.architecture")
        return value if isinstance(value, str) else None


class _Reader:
    """Little-endian cursor over a memory-mapped file that reports truncation clearly."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf = buf
        self.path = path
        self.pos = 0

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise _truncated(self.path, len(self.buf), "in its header")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def raw(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.buf):
            raise _truncated(self.path, len(self.buf), "in its header")
        data = self.buf[self.pos : self.pos + size]
        self.pos += size
        return data

    def string(self) -> str:
        data = self.raw(self.unpack("<Q"))
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"{self.path} has a metadata string that is not UTF-8 at byte {self.pos}; "
                "the file is corrupt. Download or export it again."
            ) from exc

    def value(self, type_id: int) -> Any:
        if type_id in _SCALAR_FORMATS:
            value = self.unpack(_SCALAR_FORMATS[type_id])
            # A float32 read into a Python float shows noise digits (1e-5 -> 9.99e-06);
            # the shortest float32 repr gives back the value that was written.
            return _float32_to_float(value) if type_id == 6 else value
        if type_id == _STRING:
            return self.string()
        if type_id == _ARRAY:
            item_type = self.unpack("<I")
            count = self.unpack("<Q")
            if item_type in _NUMPY_DTYPES:
                import numpy as np

                dtype = np.dtype(_NUMPY_DTYPES[item_type])
                data = self.raw(count * dtype.itemsize)
                values = np.frombuffer(data, dtype=dtype).tolist()
                return [_float32_to_float(v) for v in values] if item_type == 6 else values
            if count > len(self.buf) - self.pos:
                raise _truncated(self.path, len(self.buf), "in its header")
            return [self.value(item_type) for _ in range(count)]
        raise ValueError(
            f"{self.path} has a metadata value of unknown type {type_id} at byte {self.pos}; "
            "the file is corrupt or from a newer GGUF version."
        )


def _float32_to_float(value: float) -> float:
    import numpy as np

    return float(str(np.float32(value)))


def _truncated(path: Path, size: int, where: str) -> ValueError:
    return ValueError(
        f"{path} is truncated ({size:,} bytes, ends {where}); the download or copy was "
        "probably interrupted. Fetch the GGUF file again."
    )


def read_gguf_header(gguf_path: str | os.PathLike[str]) -> GGUFHeader:
    """Read the metadata and tensor table of a GGUF file, and check it is complete.

    Only the header is parsed; the tensor data is not read, so this is fast even for
    large files. The file size is checked against the end of the last tensor.

    Args:
        gguf_path: Path of the ``.gguf`` file.

    Returns:
        The parsed header.

    Raises:
        FileNotFoundError: The file does not exist.
        ValueError: The path is a folder, not a GGUF file, an unsupported GGUF version,
            or truncated.
    """
    path = Path(gguf_path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"GGUF file not found: {path}. Check the path and try again.")
    if path.is_dir():
        raise ValueError(f"{path} is a folder; pass the path of the .gguf file inside it.")
    size = path.stat().st_size
    with path.open("rb") as f:
        magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise ValueError(
                f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r}). "
                "Pass a .gguf file written by llama.cpp or a compatible tool."
            )
        if size < 24:
            raise _truncated(path, size, "in its header")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse_header(_Reader(buf, path), size)


def _parse_header(reader: _Reader, size: int) -> GGUFHeader:
    path = reader.path
    reader.pos = 4
    version = reader.unpack("<I")
    if version not in (2, 3):
        raise ValueError(
            f"{path} is GGUF version {version}; only versions 2 and 3 (little-endian) are "
            "supported. Convert it again with a recent llama.cpp."
        )
    n_tensors = reader.unpack("<Q")
    n_metadata = reader.unpack("<Q")
    # Each entry takes at least 8 bytes, so larger counts mean a damaged header.
    if max(n_tensors, n_metadata) > size // 8:
        raise _truncated(path, size, "in its header")
    metadata: dict[str, Any] = {}
    for _ in range(n_metadata):
        key = reader.string()
        metadata[key] = reader.value(reader.unpack("<I"))
    tensors: dict[str, GGUFTensorInfo] = {}
    for _ in range(n_tensors):
        name = reader.string()
        n_dims = reader.unpack("<I")
        if n_dims > 8:
            raise _truncated(path, size, "in its tensor table")
        dims = [reader.unpack("<Q") for _ in range(n_dims)]
        type_id = reader.unpack("<I")
        offset = reader.unpack("<Q")
        tensors[name] = GGUFTensorInfo(name, tuple(reversed(dims)), type_id, offset)
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0:
        raise ValueError(f"{path} has an invalid general.alignment {alignment!r}.")
    data_offset = -(-reader.pos // alignment) * alignment
    for info in tensors.values():
        if info.type_id not in TENSOR_TYPES:
            continue  # size unknown here; import_gguf rejects the type by name
        _, block, block_bytes = TENSOR_TYPES[info.type_id]
        count = 1
        for dim in info.shape:
            count *= dim
        end = data_offset + info.offset + -(-count // block) * block_bytes
        if end > size:
            raise _truncated(path, size, f"inside tensor {info.name!r}, which needs {end:,}")
    return GGUFHeader(path, version, metadata, tensors, data_offset, size)
