"""Row files in and out: CSV, JSONL and Parquet, read as a stream and written in input order.

Writers can stop and resume: ``mark()`` makes everything written so far durable against a
killed process and returns where that is (rows, and a byte offset or a count of Parquet parts);
a writer reopened at that mark continues the same file. Parquet cannot be appended to, so it is
written as numbered part files beside the output and joined into the output when the run ends.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import orjson

FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}
PARQUET_BATCH = 8192  # rows per Arrow batch read; memory per batch, not per file
TEXT_MARK_ROWS = 5000  # CSV/JSONL: a checkpoint at least this often (and at least every MARK_EVERY_S)
PARQUET_PART_EVERY_S = 5.0  # Parquet: a part at least this often while rows trickle in


def _part_rows() -> int:
    """Rows per Parquet part (GRADEKIT_PARQUET_PART_ROWS): smaller parts lose less to a kill, more to join."""
    return int(os.environ.get("GRADEKIT_PARQUET_PART_ROWS") or 10_000)


# The standard library's encoder for what orjson refuses (integers past 64 bits), built once.
_ROW_JSON = json.JSONEncoder(ensure_ascii=False, default=str)


def _loads(line: str) -> Any:
    """orjson for speed; the standard library for what orjson refuses (NaN, huge ints) and for its error message."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line)


def _dumps(row: dict[str, Any]) -> str:
    try:
        return orjson.dumps(row, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return _ROW_JSON.encode(row)


class InputError(ValueError):
    """An input file cannot be read at all; the message names the file (and row)."""


def file_format(path: Path) -> str:
    try:
        return FORMATS[path.suffix.lower()]
    except KeyError:
        raise InputError(f"{path}: unsupported file type {path.suffix!r}; use .csv, .jsonl or .parquet") from None


class RowError(ValueError):
    """One input row is unusable; it still gets an output row, with this as its error."""


def read_rows(path: Path, skip: int = 0) -> Iterator[dict[str, Any] | RowError]:
    """Yield each data row as a dict, or a RowError for a row that cannot be parsed.

    ``skip`` passes over rows a resumed run has already written, without parsing them where
    the format allows (JSONL lines, Parquet row groups).
    """
    kind = file_format(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if kind == "parquet":
        yield from _parquet_rows(path, skip)
        return
    with path.open(encoding="utf-8", newline="") as handle:
        if kind == "csv":
            reader = csv.DictReader(handle)
            if reader.fieldnames is None:
                return
            for number, row in enumerate(reader, start=1):
                if number <= skip:
                    continue
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
                if number <= skip:
                    continue
                try:
                    value = _loads(line)
                except json.JSONDecodeError as e:
                    yield RowError(f"{path} row {number}: not valid JSON ({e.msg} at column {e.colno})")
                    continue
                if not isinstance(value, dict):
                    yield RowError(f"{path} row {number}: a JSONL row must be an object, got {type(value).__name__}")
                else:
                    yield value


def _parquet_rows(path: Path, skip: int) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        handle = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for a damaged file
        raise InputError(f"{path}: not a readable Parquet file ({e})") from e
    with handle:
        groups = []
        for group in range(handle.num_row_groups):
            rows = handle.metadata.row_group(group).num_rows
            if not groups and skip >= rows:
                skip -= rows  # a whole row group already written: not even read
            else:
                groups.append(group)
        if not groups:
            return
        for batch in handle.iter_batches(batch_size=PARQUET_BATCH, row_groups=groups):
            rows = batch.to_pylist()
            if skip:
                rows, skip = rows[skip:], max(0, skip - len(rows))
            yield from rows


def input_columns(path: Path) -> list[str] | None:
    """The columns every row has, when the format says so up front (CSV header, Parquet schema)."""
    kind = file_format(path)
    if kind == "csv":
        with path.open(encoding="utf-8", newline="") as handle:
            return next(csv.reader(handle), [])
    if kind == "parquet":
        return list(parquet_schema(path).names)
    return None


def parquet_schema(path: Path) -> Any:
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(path)
    except Exception as e:
        raise InputError(f"{path}: not a readable Parquet file ({e})") from e


def count_rows(path: Path) -> int:
    """Rows a run will produce, for the progress bar (CSV cells may span lines, so parse)."""
    if file_format(path) == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    if file_format(path) == "jsonl":
        with path.open("rb") as handle:
            return sum(1 for line in handle if line.strip())
    return sum(1 for _ in read_rows(path))


def written_rows(path: Path) -> Iterator[dict[str, Any]]:
    """Every row of a finished output file."""
    for row in read_rows(path):
        if isinstance(row, dict):
            yield row


def fingerprint(path: Path) -> dict[str, Any]:
    """Enough to tell that an input file is the one a checkpoint was written for."""
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


class RowWriter:
    """Writes result rows to CSV, JSONL or Parquet, resumable at a ``mark()``.

    CSV columns are fixed by ``columns`` or by the first row. Parquet columns take their types
    from ``types`` (Arrow types by column; the input's schema and the result columns') and
    otherwise from the first part; nested values are written as JSON text, as in CSV.
    """

    def __init__(self, path: Path, columns: list[str] | None = None, *, types: Mapping[str, Any] | None = None,
                 resume: Mapping[str, Any] | None = None, part_rows: int | None = None) -> None:
        self.path = path
        self.kind = file_format(path)
        self._columns = columns
        self.rows = int(resume["rows"]) if resume else 0
        self._marked_rows = self.rows
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle: IO[str] | None = None
        self._csv: csv.DictWriter | None = None
        if self.kind == "parquet":
            self._parts = _PartsWriter(path, types or {}, int(resume.get("parts", 0)) if resume else 0, part_rows or _part_rows())
            return
        if resume:
            with path.open("r+b") as raw:
                raw.truncate(int(resume["offset"]))  # drop a row cut off by the kill
            self._handle = path.open("a", encoding="utf-8", newline="")
            if self.kind == "csv" and int(resume["offset"]) > 0:
                with path.open(encoding="utf-8", newline="") as existing:
                    written = next(csv.reader(existing), None)
                self._csv = csv.DictWriter(self._handle, fieldnames=written or columns or [], extrasaction="ignore")
        else:
            self._handle = path.open("w", encoding="utf-8", newline="")

    def write(self, row: dict[str, Any]) -> None:
        if self.kind == "parquet":
            self._parts.add(row)
        elif self.kind == "jsonl":
            assert self._handle is not None
            self._handle.write(_dumps(row) + "\n")
        else:
            cells = {k: _cell(v) for k, v in row.items()}
            if self._csv is None:
                assert self._handle is not None
                self._csv = csv.DictWriter(self._handle, fieldnames=self._columns or list(cells), extrasaction="ignore")
                self._csv.writeheader()
            self._csv.writerow(cells)
        self.rows += 1

    def due(self, since: float, every_s: float) -> bool:
        """Whether a checkpoint is worth writing now: a Parquet part is full, or time has passed."""
        elapsed = time.monotonic() - since
        if self.kind == "parquet":
            buffered = len(self._parts.buffer)
            return buffered >= self._parts.part_rows or (buffered > 0 and elapsed >= PARQUET_PART_EVERY_S)
        return self.rows > self._marked_rows and (elapsed >= every_s or self.rows - self._marked_rows >= TEXT_MARK_ROWS)

    def mark(self) -> dict[str, Any]:
        """Push what was written to the OS (safe from a killed process) and say where that is."""
        self._marked_rows = self.rows
        if self.kind == "parquet":
            return {"rows": self.rows, "parts": self._parts.flush()}
        assert self._handle is not None
        self._handle.flush()
        return {"rows": self.rows, "offset": self._handle.tell()}

    def mark_after_close(self) -> dict[str, Any]:
        """Where a finished output ends (its size lets a later run see it was not cut short)."""
        if self.kind == "parquet":
            return {"rows": self.rows}
        return {"rows": self.rows, "offset": self.path.stat().st_size}

    def written(self) -> Iterator[dict[str, Any]]:
        """The rows a resumed output already holds (read back, e.g. for a summary over the whole file)."""
        if self.kind == "parquet":
            import pyarrow.parquet as pq

            for number in range(self._parts.parts):
                yield from pq.read_table(self._parts._part(number)).to_pylist()
            return
        if self._handle is not None:
            self._handle.flush()
        yield from itertools.islice(written_rows(self.path), self.rows)

    def close(self, complete: bool = True) -> None:
        """Close the file; a complete Parquet run joins its parts into the output."""
        if self.kind == "parquet":
            self._parts.close(complete)
        elif self._handle is not None:
            if self._csv is None and complete and self._columns and not self.rows:
                csv.DictWriter(self._handle, fieldnames=self._columns).writeheader()  # an empty input still gets a header
            self._handle.close()


class _PartsWriter:
    """Parquet output as ``<output>.parts/part-NNNNN.parquet`` files, joined when the run ends."""

    def __init__(self, path: Path, types: Mapping[str, Any], done_parts: int, part_rows: int) -> None:
        self.path = path
        self.dir = path.with_name(path.name + ".parts")
        self.types = dict(types)
        self.schema: Any = None
        self.part_rows = part_rows
        self.parts = done_parts
        self.buffer: list[dict[str, Any]] = []
        if done_parts == 0 and self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in self.dir.glob("part-*.parquet"):  # parts written after the last mark
            if int(stale.stem.split("-")[1]) >= done_parts:
                stale.unlink()
        if done_parts:
            import pyarrow.parquet as pq

            self.schema = pq.read_schema(self._part(0))

    def _part(self, number: int) -> Path:
        return self.dir / f"part-{number:05d}.parquet"

    def add(self, row: dict[str, Any]) -> None:
        self.buffer.append(row)  # a checkpointed run writes parts at its marks (RowWriter.due), so a checkpoint names every part
        if len(self.buffer) >= 2 * self.part_rows:
            self.flush()  # a caller that never marks still gets bounded memory

    def flush(self) -> int:
        if self.buffer:
            import pyarrow.parquet as pq

            table = self._table(self.buffer)
            temporary = self._part(self.parts).with_suffix(".tmp")
            pq.write_table(table, temporary)
            os.replace(temporary, self._part(self.parts))  # a part exists whole or not at all
            self.parts += 1
            self.buffer = []
        return self.parts

    def _table(self, rows: list[dict[str, Any]]) -> Any:
        import pyarrow as pa

        if self.schema is None:
            names = list(dict.fromkeys(k for row in rows for k in row))
            self.schema = pa.schema([pa.field(name, self.types.get(name) or _infer(rows, name)) for name in names])
        columns = {}
        for field in self.schema:
            values = [row.get(field.name) for row in rows]
            columns[field.name] = _arrow_column(values, field, self.path)
        return pa.table(columns, schema=self.schema)

    def close(self, complete: bool) -> None:
        self.flush()
        if not complete:
            return
        import pyarrow.parquet as pq

        temporary = self.path.with_name(self.path.name + ".tmp")
        if self.parts == 0:
            import pyarrow as pa

            pq.write_table(pa.table({}), temporary)
        else:
            with pq.ParquetWriter(temporary, self.schema) as writer:
                for number in range(self.parts):
                    writer.write_table(pq.read_table(self._part(number), schema=self.schema))
        os.replace(temporary, self.path)
        shutil.rmtree(self.dir, ignore_errors=True)


def _infer(rows: list[dict[str, Any]], name: str) -> Any:
    """An Arrow type for a column nobody typed: numbers, booleans and text; anything nested is JSON text."""
    import pyarrow as pa

    seen = {type(row.get(name)) for row in rows if row.get(name) is not None}
    if seen == {bool}:
        return pa.bool_()
    if seen == {int}:
        return pa.int64()
    if seen and seen <= {int, float}:
        return pa.float64()
    return pa.string()


def _arrow_column(values: list[Any], field: Any, path: Path) -> Any:
    import pyarrow as pa

    kind = field.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        values = [None if v is None else (v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)) for v in values]
    elif pa.types.is_floating(kind):
        values = [None if v is None or (isinstance(v, float) and math.isnan(v)) else _number(v, field.name, path) for v in values]
    try:
        return pa.array(values, type=kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
        raise InputError(f"{path}: column {field.name!r} was written as {kind} but a later row holds another type ({e}); "
                         f"write .jsonl or .csv output for rows whose types vary") from e


def _number(value: Any, column: str, path: Path) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InputError(f"{path}: column {column!r} holds numbers, but a later row holds {value!r}") from None


def _cell(value: Any) -> Any:
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    return "" if value is None else value

