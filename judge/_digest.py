"""A file that is what it was certified on, or is refused: one sha256 per field a guarantee depends on.

A fitted cascade (judge._cascade) and an aligned rubric (judge._aligned) each carry a ``digest``:
``{field: sha256 of its value (16 hex)}``, written by the command that measured the guarantee.
Reading the file recomputes them; a field whose value no longer matches (a threshold lowered by
hand, a guideline reworded, a certificate's interval widened) is named, so the file is refused
with the field that was edited instead of being trusted for a guarantee measured on other values.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any


def value_digest(value: Any) -> str:
    """sha256 (16 hex) of a value as canonical JSON: key order does not matter, NaN and inf are spelled out."""
    if isinstance(value, float) and not math.isfinite(value):
        value = repr(value)
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def field_digest(fields: Mapping[str, Any]) -> dict[str, str]:
    """One digest per field, by name."""
    return {name: value_digest(value) for name, value in fields.items()}


def changed_fields(recorded: Mapping[str, str], fields: Mapping[str, Any]) -> list[str]:
    """The fields whose value no longer matches ``recorded``, then those recorded but no longer there, in order."""
    now = field_digest(fields)
    changed = [name for name, value in now.items() if recorded.get(name) != value]
    return changed + [name for name in recorded if name not in now]
