"""Names that moved: a module ``__getattr__`` (PEP 562) that still serves them, with a
``DeprecationWarning`` naming the one import path, for one release."""

from __future__ import annotations

import importlib
import warnings
from typing import Callable, Mapping

__all__ = ["moved_names"]


def moved_names(module: str, moved: Mapping[str, str], *, removal: str = "0.3") -> Callable:
    """A ``__getattr__`` for ``module`` that returns ``moved[name]``'s attribute ``name``
    (``moved`` maps each old name to the module that now owns it) and warns once per call
    site; any other name raises the usual ``AttributeError``."""

    def __getattr__(name: str):
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home = moved[name]
        warnings.warn(
            f"{module}.{name} is deprecated: import it from {home} "
            f"(`from {home} import {name}`), its one import path; the alias goes in "
            f"funcnet {removal}.",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)

    return __getattr__
