"""``mlxi doctor``: the MLX backend, the framework versions against the package's pinned
ranges, the Hub's reachability and the model store, in one report."""

from __future__ import annotations

from typing import Any

from mlx_integrations.cli.errors import handle_errors
from mlx_integrations.cli.options import JSON_OPTION
from mlx_integrations.cli.output import Result, prints_result


@handle_errors
@prints_result
def doctor(json_output: bool = JSON_OPTION) -> Result:
    """Report MLX's backend and device, the versions of the frameworks, whether they fit
    the ranges mlx-integrations pins, whether the Hub answers, and the model store path.

    Exits 1 when an installed version is outside its range. An unreachable Hub is
    reported only: stored models run without it.
    """
    from mlx_integrations.models.hub.reachability import check_hub
    from mlx_integrations.models.store import store_home
    from mlx_integrations.runtime import backend_info
    from mlx_integrations.runtime.environment import (
        check_requirements,
        framework_versions,
        requirement_dicts,
    )

    info: dict[str, Any] = dict(backend_info())
    info["store"] = str(store_home())
    lines = _backend_lines(info)
    versions = framework_versions()
    checks = check_requirements()
    hub = check_hub()
    lines.append("versions")
    lines += [f"  {name:18} {version or 'not installed'}" for name, version in versions.items()]
    failed = [c for c in checks if not c.ok]
    lines.append(f"{'requirements':16} {len(checks) - len(failed)} of {len(checks)} satisfied")
    lines += [
        f"  {c.requirement:30} {c.installed + ' installed' if c.installed else 'not installed'}"
        for c in failed
    ]
    lines += _hub_lines(hub)
    data = {
        **info,
        "versions": versions,
        "requirements": requirement_dicts(checks),
        "hub": hub.to_dict(),
    }
    if not failed:
        return Result(data, lines)
    wanted = " ".join(f'"{c.requirement}"' for c in failed)
    found = ", ".join(
        f"{c.name} {c.installed or 'missing'} (needs {c.requirement})" for c in failed
    )
    return Result(
        data,
        lines,
        error=f"installed versions outside the ranges mlx-integrations needs: {found}",
        hint=f"pip install {wanted}",
    )


def _backend_lines(info: dict[str, Any]) -> list[str]:
    """The backend as a reader wants it: words for what is known, nothing for what does
    not apply (no GPU rows on the CPU); the versions come once, under ``versions``."""
    rows = [("backend", f"{info['backend']} ({info['device']})")]
    if info.get("gpu_name"):
        gpu = [info["gpu_name"]]
        if info.get("gpu_memory_gb") is not None:
            gpu.append(f"{info['gpu_memory_gb']} GB")
        if info.get("gpu_arch"):
            gpu.append(str(info["gpu_arch"]))
        rows.append(("gpu", ", ".join(gpu)))
    for key, label in (("tf32", "tf32"), ("cache_check", "cache check")):
        if info.get(key) is not None:
            rows.append((label, "on" if info[key] else "off"))
    if info.get("backend") == "cpu":
        rows.append(
            (
                "cpu blas",
                info.get("cpu_blas")
                or "MLX's reference BLAS (install OpenBLAS for about 30x faster float32)",
            )
        )
    rows.append(("store", info["store"]))
    return [f"{key:16} {value}" for key, value in rows]


def _hub_lines(hub: Any) -> list[str]:
    where = f"{'hub':16} {hub.endpoint}:"
    if hub.status == "offline":
        return [f"{where} offline mode (HF_HUB_OFFLINE is set; nothing was asked)"]
    if hub.status == "reachable":
        return [f"{where} reachable (answered HTTP {hub.http_status} in {hub.seconds:.2f} s)"]
    return [
        f"{where} unreachable ({hub.error})",
        f"{'':16} pulls fail, stored models still run; check the network or HF_ENDPOINT, "
        "or set HF_HUB_OFFLINE=1",
    ]
