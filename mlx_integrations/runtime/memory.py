"""Memory figures of this machine and the settings that speak of them.

- :func:`parse_memory_size`: ``"8GB"``, ``"512MiB"`` or ``"0.6"`` (a fraction of the
  device's memory), as ``MLXI_MAX_MEMORY`` and ``pool.set_memory_budget`` take them;
- :func:`parse_keep_alive`: Ollama's ``keep_alive`` (seconds, ``"5m"``, ``"1h30m"``,
  0 to unload after each request, -1 to keep a model loaded);
- :func:`device_memory_bytes` and :func:`device_memory_limit`: what MLX's device has,
  and what one process should use of it;
- :func:`weights_on_disk`: a model's size, read from its weight files before loading.

Nothing here imports MLX until a function needs the device.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

FOREVER = math.inf
"""The keep-alive of a model that stays loaded until it is stopped or evicted."""

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "k": 1024,
    "m": 1024**2,
    "g": 1024**3,
    "t": 1024**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h)")


def parse_memory_size(value: Any, name: str = "MLXI_MAX_MEMORY") -> int | None:
    """Bytes from a size with a unit, or a fraction of the device's memory.

    ``"8GB"`` (10**9), ``"8GiB"`` or ``"8G"`` (2**30), ``"512MiB"``, ``"1500000000B"``,
    an integer number of bytes; ``"0.6"`` or ``"60%"``: that part of the device's
    memory (:func:`device_memory_bytes`). ``None``, ``""``, ``"off"`` and ``"none"``
    mean no budget.

    Args:
        value: The setting as given (a string, an int of bytes, or None).
        name: What the setting is called, for the error message.

    Returns:
        Bytes, or None for no budget.

    Raises:
        ValueError: A size that is not understood, zero, or a fraction outside (0, 1].
        TypeError: Neither a string, a number nor None.
    """
    fix = (
        "give a size with a unit ('8GB', '8GiB', '512MiB'), a fraction of the device's "
        "memory ('0.6' or '60%'), or 'off' for no budget"
    )
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TypeError(f"{name} must be a size such as '8GB' or None, got {value!r}; {fix}")
    if isinstance(value, (int, float)):
        if isinstance(value, float) and 0 < value <= 1:
            return _fraction_of_device(value)
        if not math.isfinite(value) or value < 1 or value != int(value):
            raise ValueError(f"{name}={value!r} is not a number of bytes; {fix}")
        return int(value)
    text = value.strip()
    if text.lower() in ("", "off", "none"):
        return None
    if text.endswith("%"):
        try:
            percent = float(text[:-1])
        except ValueError:
            raise ValueError(f"{name}={value!r} is not a size; {fix}") from None
        if not 0 < percent <= 100:
            raise ValueError(f"{name}={value!r}: a percentage must be in (0, 100]; {fix}")
        return _fraction_of_device(percent / 100)
    match = _SIZE.match(text)
    if match is None or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"{name}={value!r} is not a size; {fix}")
    number, unit = float(match.group(1)), match.group(2).lower()
    if not unit:
        if 0 < number <= 1:
            return _fraction_of_device(number)
        raise ValueError(
            f"{name}={value!r}: a number without a unit is a fraction of the device's "
            f"memory and must be in (0, 1]; for bytes say '{match.group(1)}B' or "
            f"'{match.group(1)}GB'"
        )
    size = int(number * _SIZE_UNITS[unit])
    if size < 1:
        raise ValueError(f"{name}={value!r} is zero; {fix}")
    return size


def _fraction_of_device(fraction: float) -> int:
    return int(fraction * device_memory_bytes())


def parse_keep_alive(value: Any, name: str = "keep_alive") -> float:
    """Seconds a model stays loaded after its last request, Ollama's way.

    A number of seconds (int, float or a numeric string); a duration string of
    ``h``, ``m``, ``s`` and ``ms`` parts (``"5m"``, ``"1h30m"``, ``"90s"``,
    ``"300ms"``); 0 unloads the model as soon as a request ends; a negative number or
    duration (``-1``, ``"-1m"``) or ``"forever"`` keeps it loaded.

    Returns:
        Seconds, :data:`FOREVER` (``math.inf``) for a model that stays loaded.

    Raises:
        TypeError: Not a number or a string. ValueError: A string that is no duration.
    """
    fix = (
        "use seconds (300), a duration ('5m', '1h30m', '90s', '300ms'), 0 to unload "
        "after each request, or -1 to keep the model loaded"
    )
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"{name} must be seconds or a duration string, got {value!r}; {fix}")
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("forever", "inf", "infinite"):
            return FOREVER
        try:
            value = float(text)
        except ValueError:
            return _parse_duration(text, value, name, fix)
    if math.isnan(value):
        raise ValueError(f"{name}={value!r} is not a duration; {fix}")
    return FOREVER if value < 0 or value == math.inf else float(value)


def _parse_duration(text: str, original: str, name: str, fix: str) -> float:
    negative = text.startswith("-")
    body = text[1:] if negative or text.startswith("+") else text
    parts = _DURATION_PART.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise ValueError(f"{name}={original!r} is not a duration; {fix}")
    seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    return FOREVER if negative and seconds > 0 else seconds


def format_keep_alive(seconds: float) -> str:
    """``"forever"``, ``"0s"``, ``"5m"``, ``"1h30m"``, ``"2.5s"``: a keep-alive as a duration."""
    if seconds == FOREVER:
        return "forever"
    if seconds != int(seconds) or seconds < 60:
        return f"{seconds:g}s"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    out = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    return out + (f"{secs}s" if secs else "")


def device_memory_bytes() -> int:
    """The memory of MLX's default device: the GPU's (Metal: unified memory, CUDA: the
    card's), or the machine's RAM on the CPU backend."""
    import mlx.core as mx

    if mx.default_device() != mx.cpu:
        info = dict(mx.device_info())
        for key in ("memory_size", "total_memory"):
            size = info.get(key)
            if isinstance(size, int) and size > 0:
                return size
    return _physical_ram()


def device_memory_limit() -> int:
    """How much memory one process should fill on MLX's device.

    On Metal the GPU's recommended working set (beyond it macOS pages, then aborts the
    process); elsewhere MLX's own memory limit (on the CPU backend and CUDA, a share
    of the RAM or of the card's memory).
    """
    import mlx.core as mx

    if mx.metal.is_available():
        info = dict(mx.device_info())
        recommended = info.get("max_recommended_working_set_size")
        if isinstance(recommended, int) and recommended > 0:
            return recommended
    return int(mx.get_memory_limit())


def _physical_ram() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not a POSIX system that says
        import mlx.core as mx

        return int(mx.get_memory_limit())


def weights_on_disk(folder: Path, *, recursive: bool = False) -> int:
    """Bytes of a model's ``*.safetensors`` files: what loading it will take, about.

    Only the files' sizes are read, never their contents.
    """
    files = folder.rglob("*.safetensors") if recursive else folder.glob("*.safetensors")
    total = 0
    for path in files:
        try:
            total += path.stat().st_size
        except OSError:
            continue
    return total
