"""Human labels as a store: one JSONL line per act (a label, a changed label, an undo), fsynced.

The viewer writes it (``gradekit view --annotate``), ``calibrate`` and ``report`` read it. A line is
``{<on>: key, "label", "note", "labeller", "time", "p"}``; ``label`` null is an undo (a line with a
numeric ``score`` and no ``label`` is a label too: a human score). Reading, the
last line per key decides its label and note; ``p`` (the probability with which the row was
offered when it entered the labelled set) comes from the act that made it labelled, so
inverse-probability-weighted PPI can undo the sampling's preference.

Durability and concurrency: each act is one ``os.write`` of the whole line on an ``O_APPEND``
descriptor under ``fcntl.flock``, then ``fsync`` before the caller acknowledges it. Two tabs or two
processes on one file never interleave a line; a writer killed mid-line leaves a torn last line,
which a reader skips with a warning (and the next writer starts on a fresh line). A symlinked
labels file is refused, as a symlinked output is (``graders/runs/_lock.py``): writing through a
link would change a file the user did not name.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import json
import math
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel


class LabelsError(ValueError):
    """The labels file cannot be used (a symlink, not a file, unwritable); the message says why."""


class LabelState(BaseModel):
    """The store read back: the labelled keys in the order they entered the labelled set."""

    records: list[dict[str, Any]]  # one per labelled key, entry order; the last act's label/note, the entry act's p
    acts: int = 0
    keyless: int = 0  # lines without the key: likely a wrong --on, which a caller may prefer to report as such
    warnings: list[str] = []

    def by_key(self, on: str) -> dict[str, dict[str, Any]]:
        return {str(r[on]): r for r in self.records}


def default_labeller() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's uid)
        return os.environ.get("USER") or f"uid{os.getuid()}"


def _key(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    return text or None


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _refuse_link(path: Path) -> None:
    if path.is_symlink():
        raise LabelsError(f"{path} is a symlink; give the labels file's own path (writing through a link would change "
                          f"{os.path.realpath(path)}, a file not named here)")
    if path.exists() and not path.is_file():
        raise LabelsError(f"{path} is not a regular file")


def read_labels(path: str | Path, on: str) -> LabelState:
    """The store's labelled keys (last line per key wins; an undo unlabels). Unreadable lines are skipped with a
    warning naming them (a torn last line is what a killed writer leaves); never fatal."""
    path = Path(path)
    _refuse_link(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return LabelState(records=[])
    except OSError as e:
        raise LabelsError(f"{path}: {e.strerror or e}") from None
    lines = data.split(b"\n")
    warnings: list[str] = []
    labelled: dict[str, dict[str, Any]] = {}  # key -> effective record; dict order = entry order
    acts = keyless = 0
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            act = json.loads(raw)
            if not isinstance(act, dict):
                raise ValueError("not an object")
        except (ValueError, UnicodeDecodeError):
            last = number == len(lines) or all(not rest.strip() for rest in lines[number:])
            warnings.append(f"{path} line {number}: " + ("a torn last line (a writer was killed mid-line), ignored" if last
                                                        else "not a JSON object (a torn line of a killed writer?), ignored"))
            continue
        if b"\\u" in raw and _SURROGATE_ESCAPE.search(raw):
            try:
                json.dumps(act, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:  # "\ud800" alone: valid JSON, no text; every answer holding it would fail
                warnings.append(f"{path} line {number}: a lone surrogate escape (half a UTF-16 pair), not text; ignored")
                continue
        key = _key(act.get(on))
        if key is None:
            warnings.append(f"{path} line {number}: no {on!r} key, ignored")
            keyless += 1
            continue
        acts += 1
        label = act.get("label")
        if "label" in act and act.get("score") is None and (label is None or (isinstance(label, str) and not label.strip())):
            labelled.pop(key, None)  # an undo: the row is unlabelled again (and re-enters later with its own p)
            continue
        if key in labelled:
            labelled[key] = {**act, on: key, "p": labelled[key].get("p")}
        else:
            labelled[key] = {**act, on: key}
    return LabelState(records=list(labelled.values()), acts=acts, keyless=keyless, warnings=warnings)


def looks_like_store(path: str | Path) -> bool:
    """A JSONL labels file may be a store (last line per key wins); CSV and Parquet are tables."""
    return Path(path).suffix.lower() in (".jsonl", ".ndjson")


STORE_FIELDS = ("labeller", "time")  # what every act the viewer writes carries, and a plain labels table does not


def read_label_file(path: str | Path, on: str, column: str = "label") -> LabelState:
    """Every command's reader of a human labels file (calibrate, view, report): its labelled keys, one record each.

    A JSONL file whose lines carry the store's ``labeller``/``time`` is the viewer's labels store: the last
    line per key wins (:func:`read_labels`). Anything else, a CSV, a Parquet file or a JSONL table of key and
    label, is a table read by the run's reader (a CSV's ``yes``/``no`` stay text, never booleans): a key
    labelled twice with different labels is a LabelsError naming the key, since no line says which one is
    meant (the same label twice is one label). ``keyless`` counts rows without ``on``.
    """
    from ..runs._io import InputError, RowError, read_rows

    path = Path(path)
    _refuse_link(path)
    if not path.is_file():
        raise LabelsError(f"{path}: no such labels file")
    if looks_like_store(path):
        state = read_labels(path, on)
        if state.records and any(field in r for r in state.records for field in STORE_FIELDS):
            return state
    records: dict[str, dict[str, Any]] = {}
    where: dict[str, int] = {}
    keyless = 0
    try:
        for number, row in enumerate(read_rows(path), start=1):
            if isinstance(row, RowError):
                raise LabelsError(f"labels file {path}: {row}")
            key = _key(row.get(on))
            if key is None:
                keyless += 1
                continue
            label = _key(row.get(column))
            if key in records:
                first = _key(records[key].get(column))
                if label != first:
                    raise LabelsError(f"labels file {path}: key {on}={key!r} is labelled twice with different labels "
                                      f"({first!r} on row {where[key]}, {label!r} on row {number}): keep one")
                continue
            records[key], where[key] = {**row, on: key}, number
    except InputError as e:
        raise LabelsError(f"labels file {path}: {e}") from None
    return LabelState(records=list(records.values()), acts=len(records), keyless=keyless)


class LabelStore:
    """The appending side: ``append`` returns once the line is on disk (fsync). Thread- and process-safe."""

    def __init__(self, path: str | Path, on: str, labeller: str | None = None) -> None:
        self.path = Path(path)
        self.on = on
        self.labeller = labeller or default_labeller()
        _refuse_link(self.path)
        created = not self.path.exists()
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise LabelsError(f"cannot write {self.path}: {e.strerror}") from None
        if created:  # the new name itself must survive a crash: fsync the folder
            with contextlib.suppress(OSError):
                folder = os.open(self.path.parent, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.fsync(folder)
                finally:
                    os.close(folder)
        self._thread = threading.Lock()  # flock is per open file description: threads of one process need their own lock

    def append(self, key: str | int, label: str | None, note: str | None = None, p: float | None = None) -> dict[str, Any]:
        """Write one act (``label`` None: an undo) and fsync it; the stored record. ``key`` as the graded file holds it
        (an int stays an int: the line's key equals the row's); the reader compares keys as text."""
        record = {self.on: key, "label": label, "note": note or None, "labeller": self.labeller,
                  "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), "p": p}
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        with self._thread:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                size = os.fstat(self._fd).st_size
                if size and os.pread(self._fd, 1, size - 1) != b"\n":
                    line = b"\n" + line  # a killed writer's torn line: start ours on a line of its own
                view = memoryview(line)
                while view:
                    view = view[os.write(self._fd, view):]
                os.fsync(self._fd)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        return record

    def read(self) -> LabelState:
        return read_labels(self.path, self.on)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def parse_label_map(pairs: Iterable[str]) -> dict[str, str]:
    """``--label-map yes=correct,no=incorrect`` (repeatable or comma-separated) -> {human: judge}."""
    found: dict[str, str] = {}
    for item in pairs:
        for pair in item.split(","):
            if not pair.strip():
                continue
            human, sep, judge = pair.partition("=")
            if not sep or not human.strip() or not judge.strip():
                raise ValueError(f"`label_map` {pair!r}: expected HUMAN=JUDGE, e.g. yes=correct")
            found[human.strip()] = judge.strip()
    return found


def check_vocabularies(human: Iterable[Any], judge: Iterable[Any], human_source: str = "human labels",
                       judge_source: str = "the judge") -> None:
    """A ValueError when the two label vocabularies share no value: every row would count as a disagreement."""
    h = sorted({str(v) for v in human if v is not None and str(v).strip()})
    j = sorted({str(v) for v in judge if v is not None and str(v).strip()})
    if h and j and not set(h) & set(j):
        example = ",".join(f"{a}=<{'|'.join(j)}>" for a in h[:3])
        raise ValueError(f"the {human_source} ({', '.join(h)}) share no value with {judge_source}'s labels ({', '.join(j)}): "
                         f"every row would count as a disagreement. Map them with `label_map` HUMAN=JUDGE,... "
                         f"(e.g. `label_map` {example})")


def mapped(rows: Sequence[Mapping[str, Any]], column: str, label_map: Mapping[str, str]) -> list[dict[str, Any]]:
    """The rows with ``column`` mapped through ``label_map`` (values not in it unchanged)."""
    if not label_map:
        return [dict(r) for r in rows]
    return [{**r, column: label_map.get(str(r.get(column)).strip(), r.get(column)) if r.get(column) is not None else None}
            for r in rows]


# -- which row to label next ---------------------------------------------------------------------

UNIFORM_SHARE = 0.1  # of each draw's probability spread evenly: every unlabelled row keeps p > 0, so IPW stays unbiased
PRIOR_LABELS = 5  # pseudo-labels behind the prior guess of each uncertainty level's squared correction
BINS = 10


def as_number(value: Any) -> float | None:
    """A finite number, or None (a bool, text, NaN or a missing value is not a score)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def uncertainty(row: Mapping[str, Any], score_range: tuple[float, float] | None = None) -> float | None:
    """How unsure the judge was about ``row``, in [0, 1] (0: sure); None without a verdict (nothing to correct).

    The largest of: the score's closeness to the middle of its range, the two orders of a pair
    disagreeing (``agree`` false), a jury's disagreement (``1 - agreement``, doubled: a 50/50 split
    is the most unsure), a cascade's ``1 - confidence``.
    """
    if row.get("status") not in (None, "", "ok"):
        return None
    score = as_number(row.get("score"))
    if score is None:
        return None
    found = [0.0]
    if score_range is not None and score_range[1] > score_range[0]:
        x = (score - score_range[0]) / (score_range[1] - score_range[0])
        found.append(1 - abs(2 * min(1.0, max(0.0, x)) - 1))
    agree = row.get("agree")
    if agree is False or (isinstance(agree, str) and agree.strip().lower() in ("false", "0")):
        found.append(1.0)
    agreement = as_number(row.get("agreement"))
    if agreement is not None:
        found.append(min(1.0, max(0.0, 2 * (1 - agreement))))
    confidence = as_number(row.get("confidence"))
    if confidence is not None:
        found.append(min(1.0, max(0.0, 1 - confidence)))
    return max(found)


def level(u: float) -> int:
    """The uncertainty level (0 to BINS) a row's squared correction is pooled in."""
    return min(BINS, max(0, round(u * BINS)))


def level_weights(sums: Sequence[float], counts: Sequence[int]) -> list[float]:
    """Per uncertainty level: sqrt of its estimated squared correction (the labels' mean, shrunk towards the prior)."""
    return [math.sqrt((sums[b] + PRIOR_LABELS * (0.1 + 0.15 * b / BINS)) / (counts[b] + PRIOR_LABELS))
            for b in range(BINS + 1)]


def draw_probabilities(uncertainties: Sequence[float | None], strategy: str = "active",
                       seen: Iterable[tuple[float | None, float]] = ()) -> list[float]:
    """Each unlabelled row's probability of being offered next.

    ``random``: uniform. ``active`` (Zrnic and Candès's rule): proportional to the square root of
    the row's expected squared correction E[((y - f) / range)^2], estimated per uncertainty level
    from ``seen`` (each labelled row's uncertainty and squared correction so far) and shrunk towards
    a prior that trusts the uncertainty (0.1 for a sure verdict up to 0.25, a coin's, for the
    most unsure); mixed with uniform (``UNIFORM_SHARE``) so that no row's p is 0. A row without a
    verdict (None) gets the uniform share only: its label corrects nothing.
    """
    m = len(uncertainties)
    if m == 0:
        return []
    if strategy == "random":
        return [1.0 / m] * m
    if strategy != "active":
        raise ValueError(f"strategy must be active or random, not {strategy!r}")
    sums = [0.0] * (BINS + 1)
    counts = [0] * (BINS + 1)
    for u, r in seen:
        if u is not None:
            sums[level(u)] += min(1.0, max(0.0, r))
            counts[level(u)] += 1
    roots = level_weights(sums, counts)
    weights = [roots[level(u)] if u is not None else 0.0 for u in uncertainties]
    total = sum(weights)
    if total <= 0:
        return [1.0 / m] * m
    return [(1 - UNIFORM_SHARE) * w / total + UNIFORM_SHARE / m for w in weights]
