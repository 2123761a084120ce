"""Drift, seen: which judge the provider says answered each row, and when that changed mid-run.

A model name like ``gpt-4o`` is an alias the provider may move to a newer snapshot at any time;
a self-hosted vLLM changes with its version, GPU, parallelism or quantisation. Each reply names
what served it (``model``, ``system_fingerprint``: :func:`gradekit.judge._wire.served_of`), each
output row records it, and :class:`ServedTally` counts rows per (model, fingerprint) in output
order and lists where it changed. A change of fingerprint alone says the backend changed, not
that the verdicts did: the canary (:mod:`gradekit.graders.runs._canary`) tests that.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

CHANGES_LISTED = 20  # changes a summary lists; the rest are counted (a cache mixing two judges flips at every row)
LONG_RUN_ROWS = 1000  # a run this long (or LONG_RUN_S) gets the alias note: long enough for a provider to move an alias
LONG_RUN_S = 600.0

# What pins a model to one snapshot: a date (2024-08-06, 20240806, @20240620, Ark's -250115), a 4-digit release
# (gpt-4-0613, mistral-large-2407), a 3-digit snapshot (gemini-1.5-pro-002), a -vN or :N version (anthropic.claude-v2:1).
# "latest" pins nothing, whatever else the name has.
_PINNED = re.compile(r"(\d{4}-\d{2}-\d{2}|\d{8}|@\d+|-\d{3,6}(?=$|[-:@])|-v\d+(?=$|[-:.])|:\d+$)")


def is_alias(model: str | None) -> bool:
    """Whether ``model`` names a moving target (no date or version): ``gpt-4o``, ``deepseek-chat``, ``qwen-max-latest``.

    A name with a ``/`` (``Qwen/Qwen2.5-7B-Instruct``) names weights a server loaded, not a provider's alias.
    """
    if not model or "/" in model:
        return False
    return "latest" in model.lower() or _PINNED.search(model) is None


def alias_note(requested: str | None, served: list[dict[str, Any]], rows: int, wall_s: float) -> str | None:
    """One line for a long run whose judge (or a jury's or cascade's member) is named by an alias; None for a short run
    or pinned names."""
    if not requested or not (rows >= LONG_RUN_ROWS or wall_s >= LONG_RUN_S):
        return None
    panel = re.fullmatch(r"(?:jury|cascade)\((.*)\)", requested)  # a panel's name: jury(a, b), cascade(a -> b)
    names = re.split(r",\s*|\s*->\s*", panel.group(1)) if panel else [requested]
    aliases = [name for name in names if is_alias(name)]
    if not aliases:
        return None
    seen = sorted({str(s["model"]) for s in served if s.get("model") and s.get("model") not in names})
    behind = f" (the provider served {', '.join(seen)})" if seen else ""
    which = f"model {aliases[0]!r} is an alias" if len(aliases) == 1 else f"models {', '.join(map(repr, aliases))} are aliases"
    return (f"note: {which} with no date or version{behind}: the provider may move it to another snapshot during a long run; "
            "pin a dated snapshot, and see `served` for what answered each row")


class ServedTally:
    """Rows per (served model, system_fingerprint), in output order, and the rows where it changed.

    A row whose reply named neither (an error before any reply, an input error) is not counted.
    ``state`` / ``restore`` carry it through a checkpoint, so a resumed run's summary covers the whole output.
    """

    def __init__(self) -> None:
        self.groups: list[dict[str, Any]] = []  # {"model", "system_fingerprint", "rows", "first_row", "last_row"}
        self.changes: list[dict[str, Any]] = []
        self.change_count = 0
        self.last: list[str | None] | None = None

    def add(self, row: int, model: Any, fingerprint: Any) -> None:
        model = model if isinstance(model, str) and model else None
        fingerprint = fingerprint if isinstance(fingerprint, str) and fingerprint else None
        if model is None and fingerprint is None:
            return
        group = next((g for g in self.groups if g["model"] == model and g["system_fingerprint"] == fingerprint), None)
        if group is None:
            group = {"model": model, "system_fingerprint": fingerprint, "rows": 0, "first_row": row, "last_row": row}
            self.groups.append(group)
        group["rows"] += 1
        group["last_row"] = max(group["last_row"], row)
        if self.last is not None and self.last != [model, fingerprint]:
            self.change_count += 1
            if len(self.changes) < CHANGES_LISTED:
                self.changes.append({"row": row, "model": model, "system_fingerprint": fingerprint,
                                     "was": {"model": self.last[0], "system_fingerprint": self.last[1]}})
        self.last = [model, fingerprint]

    def add_written(self, row: int, cells: Mapping[str, Any]) -> None:
        """A row kept from an earlier output (its cells may be CSV text: an empty cell is none)."""
        self.add(row, cells.get("served_model") or None, cells.get("system_fingerprint") or None)

    def state(self) -> dict[str, Any]:
        return {"groups": self.groups, "changes": self.changes, "change_count": self.change_count, "last": self.last}

    @classmethod
    def restore(cls, state: Mapping[str, Any] | None) -> ServedTally:
        tally = cls()
        if isinstance(state, Mapping):
            tally.groups = [dict(g) for g in state.get("groups") or []]
            tally.changes = [dict(c) for c in state.get("changes") or []]
            tally.change_count = int(state.get("change_count") or 0)
            tally.last = list(state["last"]) if state.get("last") else None
        return tally
