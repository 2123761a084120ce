"""The resume checkpoint of a file run: which input and settings, and how much output is final."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._io import fingerprint


class Checkpoint:
    """``<output>.checkpoint.json``: which input file and settings, and how much output is final.

    Written atomically (temp file + rename) after the output is flushed, so it never claims rows
    the output lacks; a killed process leaves at most some unclaimed rows, which a resume drops.
    """

    def __init__(self, source: Path, destination: Path, settings: Mapping[str, Any]) -> None:
        self.path = destination.with_name(destination.name + ".checkpoint.json")
        self.destination = destination
        self.identity = {"input": fingerprint(source), "settings": json.loads(json.dumps(settings, default=str))}

    def load(self) -> dict[str, Any] | None:
        """The saved state, if it belongs to this input, these settings and an output still there."""
        try:
            state = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(state, dict) or state.get("identity") != self.identity:
            return None
        mark = state.get("mark") or {}
        parts = self.destination.with_name(self.destination.name + ".parts")
        if not (self.destination.exists() or (mark.get("parts") and parts.is_dir())):
            return None  # the output (or a Parquet run's parts) is gone: start over
        if "offset" in mark and self.destination.stat().st_size < int(mark["offset"]):
            return None  # the output was cut shorter than the checkpoint says: start over
        return state

    def save(self, mark: Mapping[str, Any], tally: Mapping[str, Any], complete: bool = False) -> None:
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(json.dumps({"identity": self.identity, "mark": dict(mark), "tally": dict(tally), "complete": complete}),
                             encoding="utf-8")
        os.replace(temporary, self.path)

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)
