"""The installed versions of the frameworks this package works with, and whether they fit
its pinned ranges (read from the installed package's own metadata)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any

DISTRIBUTION = "mlx-integrations"

# Distribution names, as pip shows them; the optional ones may be absent.
FRAMEWORKS = (
    "mlx",
    "mlx-lm",
    "mlx-vlm",
    "langchain-core",
    "langchain",
    "llama-index-core",
    "huggingface-hub",
    "transformers",
)
# Extras whose requirements are tools for working on this package, not for running it.
_DEVELOPMENT_EXTRAS = {"dev"}


@dataclass(frozen=True)
class RequirementCheck:
    """One requirement of the installed package against what is installed.

    Attributes:
        requirement: The requirement as the package declares it (``mlx-lm<0.33,>=0.32``).
        name: The distribution it names.
        extra: The extra that asks for it (``vision``), or None for a base requirement.
        installed: The installed version, or None when it is not installed.
        ok: True when the installed version is in the range; a base requirement that is
            not installed fails, an extra's is skipped (not listed).
    """

    requirement: str
    name: str
    extra: str | None
    installed: str | None
    ok: bool


def installed_version(name: str) -> str | None:
    """The installed version of a distribution, or None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def framework_versions() -> dict[str, str | None]:
    """The installed versions of MLX, mlx-lm, mlx-vlm, LangChain, LlamaIndex,
    huggingface_hub and transformers (None for one that is not installed).

    Examples:
        >>> framework_versions()["mlx-lm"]  # doctest: +SKIP
        '0.32.2'
    """
    return {name: installed_version(name) for name in FRAMEWORKS}


def check_requirements(distribution: str = DISTRIBUTION) -> list[RequirementCheck]:
    """Check the ``Requires-Dist`` ranges of the installed package against what is installed.

    Base requirements are always checked. An extra's requirements (``[cpu]``,
    ``[vision]``...) are checked when their package is installed, since only then can
    a version outside the range break anything; development extras are left out.

    Raises:
        importlib.metadata.PackageNotFoundError: ``distribution`` is not installed.

    Examples:
        >>> [c.requirement for c in check_requirements() if not c.ok]  # doctest: +SKIP
        []
    """
    from packaging.markers import default_environment
    from packaging.requirements import InvalidRequirement, Requirement

    environment = {str(k): str(v) for k, v in default_environment().items()}
    environment["extra"] = ""
    extras = metadata.metadata(distribution).get_all("Provides-Extra") or []
    checks: list[RequirementCheck] = []
    seen: set[tuple[str, str]] = set()
    for line in metadata.requires(distribution) or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is None or req.marker.evaluate(environment):
            extra = None
        else:  # the extra that asks for it; none on another platform or Python
            extra = next(
                (e for e in extras if req.marker.evaluate({**environment, "extra": e})), None
            )
            if extra is None or extra in _DEVELOPMENT_EXTRAS:
                continue
        installed = installed_version(req.name)
        if installed is None and extra is not None:
            continue  # an extra that was not installed
        if (req.name, str(req.specifier)) in seen:
            continue  # the same range again, for another extra ([cpu], [cuda])
        seen.add((req.name, str(req.specifier)))
        ok = installed is not None and req.specifier.contains(installed, prereleases=True)
        # Lower bounds first, as the ranges are written (">=0.32,<0.33").
        bounds = sorted(req.specifier, key=lambda s: (s.operator not in (">=", ">"), str(s)))
        shown = req.name + ",".join(map(str, bounds))
        checks.append(RequirementCheck(shown, req.name, extra, installed, ok))
    return checks


def requirement_dicts(checks: list[RequirementCheck]) -> list[dict[str, Any]]:
    """JSON-ready form of :func:`check_requirements`."""
    return [asdict(c) for c in checks]
