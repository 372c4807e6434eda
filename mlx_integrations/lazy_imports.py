"""Package attributes imported on first use, so importing a package stays cheap."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, modules: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``name`` from ``modules[name]`` when asked.

    Examples:
        >>> __getattr__ = lazy_attributes(__name__, {"ChatMLX": "mypackage.chat_models"})
    """

    def __getattr__(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        # Kept on the package: found at once next time, and never shadowed by a
        # submodule of the same name that an import sets on the package.
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
