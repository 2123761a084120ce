"""Finding and reading rubric specs (prompts/index.yaml and the YAML beside it), without pydantic.

``gradekit rubrics`` lists what ships: it needs the index and a few fields of each spec, not the
validated ``Rubric`` model. Importing pydantic costs more than the rest of that command together,
so the reading lives here and ``gradekit.judge._rubric`` builds its model on top of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

# The C loader when PyYAML was built with libyaml: specs and the index load several times faster.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class RubricError(ValueError):
    """A rubric spec or template is wrong; the message names the rubric and the field."""


def packaged_prompts() -> Path:
    """prompts/ as installed: ``gradekit.prompts`` (the repository's top-level prompts/, mapped in by pyproject.toml)."""
    return Path(str(resources.files("gradekit.prompts")))


def rubric_index() -> dict[str, str]:
    """The shipped rubrics' names -> spec file names, in index order."""
    index_path = packaged_prompts() / "index.yaml"
    data = yaml.load(index_path.read_text(encoding="utf-8"), Loader=YAML_LOADER) or {}
    return dict(data.get("rubrics", {}))


def spec_path(name_or_path: str | Path) -> Path:
    """The YAML spec of a shipped rubric (by name) or of a user's rubric (a path to its .yaml)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return path
    index = rubric_index()
    if str(name_or_path) not in index and (path.suffix in (".yaml", ".yml") or len(path.parts) > 1):
        # A path, not a name: "unknown rubric" would send the user looking for a name they never typed.
        raise RubricError(f"{path}: no such rubric file" + ("" if path.parent.is_dir() else f" (no folder {path.parent})"))
    if str(name_or_path) not in index:
        known = ", ".join(index)
        raise RubricError(f"unknown rubric {str(name_or_path)!r}; shipped rubrics: {known} (or give a path to a .yaml spec)")
    return packaged_prompts() / index[str(name_or_path)]


def read_spec(path: Path) -> dict[str, Any]:
    """A spec file's mapping, unvalidated (``judge.load_rubric`` validates it)."""
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=YAML_LOADER)
    except yaml.YAMLError as e:
        raise RubricError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise RubricError(f"{path}: a rubric spec must be a mapping")
    return data


@dataclass(frozen=True)
class RubricSummary:
    """What ``gradekit rubrics`` shows of a rubric: the fields a user picks one by, with the model's defaults.

    tests/judge/test_rubrics.py checks each shipped rubric's summary against its validated ``Rubric``.
    """

    name: str
    description: str = ""
    language: str = "en"
    variables: dict[str, str] = field(default_factory=dict)  # variable -> "str" or "list"
    output_mode: str = ""
    labels: dict[str, float] = field(default_factory=dict)
    unmatched: float | str = "error"

    @classmethod
    def from_spec(cls, data: dict[str, Any]) -> RubricSummary:
        unmatched = data.get("unmatched", "error")
        return cls(
            name=str(data.get("name", "")),
            description=str(data.get("description", "")),
            language=str(data.get("language", "en")),
            variables={str(k): (v or {}).get("type", "str") for k, v in (data.get("variables") or {}).items()},
            output_mode=str((data.get("output") or {}).get("mode", "")),
            labels={str(k): float(v) for k, v in (data.get("labels") or {}).items()},
            unmatched=unmatched if unmatched == "error" else float(unmatched),
        )


def rubric_summaries() -> list[RubricSummary]:
    """Every shipped rubric, in index order, read from its spec without validating it."""
    return [RubricSummary.from_spec(read_spec(spec_path(name))) for name in rubric_index()]
