"""Row files in and out: CSV and JSONL, read as a stream and written in input order."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}


class InputError(ValueError):
    """An input file cannot be read at all; the message names the file (and row)."""


def file_format(path: Path) -> str:
    try:
        return FORMATS[path.suffix.lower()]
    except KeyError:
        raise InputError(f"{path}: unsupported file type {path.suffix!r}; use .csv or .jsonl") from None


class RowError(ValueError):
    """One input row is unusable; it still gets an output row, with this as its error."""


def read_rows(path: Path) -> Iterator[dict[str, Any] | RowError]:
    """Yield each data row as a dict, or a RowError for a row that cannot be parsed."""
    kind = file_format(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    with path.open(encoding="utf-8", newline="") as handle:
        if kind == "csv":
            reader = csv.DictReader(handle)
            if reader.fieldnames is None:
                return
            for number, row in enumerate(reader, start=1):
                if None in row:  # more cells than header columns
                    yield RowError(f"{path} row {number}: {len(row[None])} more cell(s) than the header has columns")
                else:
                    yield dict(row)
        else:
            number = 0
            for line in handle:
                if not line.strip():
                    continue
                number += 1
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as e:
                    yield RowError(f"{path} row {number}: not valid JSON ({e.msg} at column {e.colno})")
                    continue
                if not isinstance(value, dict):
                    yield RowError(f"{path} row {number}: a JSONL row must be an object, got {type(value).__name__}")
                else:
                    yield value


def csv_header(path: Path) -> list[str] | None:
    if file_format(path) != "csv":
        return None
    with path.open(encoding="utf-8", newline="") as handle:
        return next(csv.reader(handle), [])


def count_rows(path: Path) -> int:
    """Rows a run will produce, for the progress bar (CSV cells may span lines, so parse)."""
    return sum(1 for _ in read_rows(path))


class RowWriter:
    """Writes result rows. CSV columns are fixed by the first row; later keys are added as JSON."""

    def __init__(self, path: Path, columns: list[str] | None = None) -> None:
        self.path = path
        self._columns = columns
        self.kind = file_format(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle: IO[str] = path.open("w", encoding="utf-8", newline="")
        self._csv: csv.DictWriter | None = None
        self.rows = 0

    def write(self, row: dict[str, Any]) -> None:
        if self.kind == "jsonl":
            self._handle.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        else:
            cells = {k: _cell(v) for k, v in row.items()}
            if self._csv is None:
                columns = self._columns or list(cells)
                self._csv = csv.DictWriter(self._handle, fieldnames=columns, extrasaction="ignore")
                self._csv.writeheader()
            self._csv.writerow(cells)
        self.rows += 1

    def close(self) -> None:
        self._handle.close()


def _cell(value: Any) -> Any:
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    return "" if value is None else value
