"""The resume checkpoint of a file run: which input and settings, and how much output is final."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._io import InputError, RunInput, tail_hash, text_rows_before


class Checkpoint:
    """``<output>.checkpoint.json``: which input file and settings, and how much output is final.

    Written atomically (temp file + rename) after the output is flushed, so it never claims rows
    the output lacks; a killed process leaves at most some unclaimed rows, which a resume drops.
    """

    warning: str | None = None  # why load() did not trust the checkpoint it found

    def __init__(self, source: RunInput, destination: Path, settings: Mapping[str, Any]) -> None:
        self.path = destination.with_name(destination.name + ".checkpoint.json")
        self.destination = destination
        self.identity = {"input": source.fingerprint, "settings": json.loads(json.dumps(settings, default=str))}

    def load(self) -> dict[str, Any] | None:
        """The saved state, if it belongs to this input, these settings and the output as it is now.

        A checkpoint that disagrees with the output (edited, stale, or the output changed since)
        is not trusted: ``warning`` says why, and the run starts over rather than lose rows or
        append to a torn line.
        """
        self.warning = None
        try:
            state = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            self.warning = f"{self.path} cannot be read ({type(e).__name__}: {e}); grading every row again"
            return None
        if not (isinstance(state, dict) and isinstance(state.get("identity"), dict) and isinstance(state.get("mark"), dict)
                and isinstance(state.get("tally"), dict)):
            self.warning = f"{self.path} is not a checkpoint gradekit wrote (malformed); grading every row again"
            return None
        if state["identity"] != self.identity:
            self._refuse_other_settings(state)
            return None
        mark = state["mark"]
        parts = self.destination.with_name(self.destination.name + ".parts")
        if not (self.destination.exists() or (mark.get("parts") and parts.is_dir())):
            return None  # the output (or a Parquet run's parts) is gone: start over
        try:
            problem = self._disagreement(state, mark, parts)
        except (OSError, ValueError, TypeError, KeyError) as e:
            problem = f"it cannot be checked against the output ({type(e).__name__}: {e})"
        if problem is not None:
            self.warning = f"{self.path} does not match {self.destination}: {problem}; grading every row again"
            return None
        return state

    def _refuse_other_settings(self, state: Mapping[str, Any]) -> None:
        """A finished output of the same input, graded with other settings, is not replaced unless asked (``--restart``)."""
        before = state["identity"].get("settings")
        if not (state.get("complete") and self.destination.exists() and isinstance(before, dict)
                and state["identity"].get("input") == self.identity["input"]):
            return
        now = self.identity["settings"]
        differ = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
        if not differ:
            return
        shown = "; ".join(_difference(k, before.get(k), now.get(k)) for k in differ)
        raise InputError(f"{self.destination} is a finished output graded with other settings ({shown}); "
                         "pass `resume=False` to grade it again and replace it, or choose another output path")

    def _disagreement(self, state: Mapping[str, Any], mark: Mapping[str, Any], parts: Path) -> str | None:
        """Why the output is not what the checkpoint says (rows, size, the hash of its last bytes), or None."""
        rows = int(mark["rows"])
        if "offset" in mark:  # CSV / JSONL
            offset, size = int(mark["offset"]), self.destination.stat().st_size
            if size < offset or (state.get("complete") and size != offset):
                return f"the output has {size} bytes where the checkpoint says {offset}"
            if "tail" in mark and tail_hash(self.destination, offset) != mark["tail"]:
                return "the last row it claims differs from the output's"
            found = text_rows_before(self.destination, offset)
            if found != rows:
                return f"it claims {rows} rows, the output holds {found}"
            return None
        import pyarrow.parquet as pq

        if state.get("complete"):
            found = pq.ParquetFile(self.destination).metadata.num_rows
        else:
            found = sum(pq.ParquetFile(parts / f"part-{n:05d}.parquet").metadata.num_rows for n in range(int(mark.get("parts", 0))))
        return None if found == rows else f"it claims {rows} rows, the output holds {found}"

    def save(self, mark: Mapping[str, Any], tally: Mapping[str, Any], complete: bool = False,
             canary: Mapping[str, Any] | None = None) -> None:
        """``canary``: the run's canary state (runs._canary), so a resumed run checks against its start."""
        temporary = self.path.with_name(self.path.name + ".tmp")
        state = {"identity": self.identity, "mark": dict(mark), "tally": dict(tally), "complete": complete}
        if canary is not None:
            state["canary"] = dict(canary)
        temporary.write_text(json.dumps(state), encoding="utf-8")
        os.replace(temporary, self.path)

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


def _difference(key: str, before: Any, now: Any) -> str:
    """One setting that differs, as a user reads it (a rubric is recorded as a hash of its spec and template)."""
    if key == "rubric":
        return "rubric: another rubric, or its spec or template changed"
    return f"{key}: {json.dumps(before, ensure_ascii=False)} there, {json.dumps(now, ensure_ascii=False)} now"
