"""Public names that load on first use, so that a package's ``__init__`` costs nothing to import.

``gradekit --help`` must start without openai, pandas, scipy or the server stack. A package
``__init__`` that imported every implementation module would load them all; instead it lists
which private module owns each public name, and PEP 562's module ``__getattr__`` imports that
module the first time the name is asked for. ``from gradekit.judge import Judge`` works as before.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_names(package: str, owners: Mapping[str, Sequence[str]]) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``(__all__, __getattr__, __dir__)`` for ``package`` from ``{".module": [names...]}``."""
    where = {name: module for module, names in owners.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return sorted(where), __getattr__, __dir__
