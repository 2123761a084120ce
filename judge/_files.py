"""Reading the YAML/JSON files users write: grader configs, price tables, server configs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


def read_data_file(path: Path, what: str) -> Any:
    """The data in a YAML file (JSON when it ends in .json); ValueError naming the file and ``what`` it is."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{path}: cannot read the {what}: {e.strerror or e}") from e
    as_json = path.suffix.lower() == ".json"
    try:
        return json.loads(text) if as_json else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: the {what} is not valid {'JSON' if as_json else 'YAML'}: {e}") from e
