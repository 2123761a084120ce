"""gradekit's optional features: which extra installs each library, and the one line a user sees without it.

``pip install gradekit`` is the core: grading a file with an LLM judge, the command line and the fake
provider. A feature whose library is not installed fails where it starts (a command, a grader being
built, an output format chosen), before any row is judged, with :class:`MissingExtra`: one line naming
the ``pip install 'gradekit[...]'`` that adds it. The command line turns it into exit status 2.
``tests/project/test_dependencies.py`` holds this table to pyproject.toml's optional dependencies.
"""

from __future__ import annotations

import importlib.util

# extra -> the top-level modules it installs that gradekit imports.
EXTRAS: dict[str, tuple[str, ...]] = {
    "calibration": ("scipy", "sklearn", "matplotlib", "krippendorff"),
    "math": ("math_verify",),
    "server": ("fastapi", "prometheus_client"),
    "parquet": ("pyarrow",),
    "redis": ("redis", "limits", "coredis"),
    "view": ("duckdb",),
    "ray": ("ray",),
    "meteor": ("nltk", "wn"),
}
_EXTRA_OF = {module: extra for extra, modules in EXTRAS.items() for module in modules}


class MissingExtra(ImportError):
    """A feature's optional library is not installed; ``str(error)`` is the one line that says how to add it."""

    def __init__(self, feature: str, module: str, extra: str) -> None:
        super().__init__(f"{feature} needs {module}, which is not installed: pip install 'gradekit[{extra}]'", name=module)
        self.feature, self.module, self.extra = feature, module, extra


def extra_of(module: str) -> str | None:
    """The extra that installs ``module`` (a dotted name is looked up by its top level), or None for the core."""
    return _EXTRA_OF.get(module.partition(".")[0])


def require(extra: str, feature: str) -> None:
    """Raise :class:`MissingExtra` for ``feature`` unless every library of ``extra`` can be found.

    Found, not imported: the check costs a directory look-up, so a command can make it before its work
    starts without loading SciPy or Ray.
    """
    for module in EXTRAS[extra]:
        if importlib.util.find_spec(module) is None:
            raise MissingExtra(feature, module, extra)


def as_missing_extra(error: BaseException, feature: str) -> MissingExtra | None:
    """The :class:`MissingExtra` an ImportError stands for when the module it could not find is an extra's."""
    if isinstance(error, MissingExtra):
        return error
    name = getattr(error, "name", None)
    extra = extra_of(name) if isinstance(error, ImportError) and name else None
    return MissingExtra(feature, name.partition(".")[0], extra) if extra and name else None
