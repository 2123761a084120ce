"""Row files in and out: CSV, JSONL and Parquet, read as a stream and written in input order.

Writers can stop and resume: ``mark()`` makes everything written so far durable against a
killed process and returns where that is (rows, and a byte offset or a count of Parquet parts);
a writer reopened at that mark continues the same file. Parquet cannot be appended to, so it is
written as numbered part files beside the output and joined into the output when the run ends.
"""

from __future__ import annotations

import codecs
import csv
import functools
import io
import itertools
import json
import math
import os
import re
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import IO, Any

import orjson

from gradekit._extras import require

FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}
PARQUET_BATCH = 8192  # rows per Arrow batch read; memory per batch, not per file
TEXT_MARK_ROWS = 5000  # CSV/JSONL: a checkpoint at least this often (and at least every MARK_EVERY_S)
PARQUET_PART_EVERY_S = 5.0  # Parquet: a part at least this often while rows trickle in
CSV_CELL_LIMIT = 128 * 1024  # characters in one CSV cell: the csv module's default limit, kept as a per-row error
FIRST_ROWS = 2  # data rows that must decode, with the header, before a file is taken to be in its encoding
_PROBE_BYTES = 1 << 20  # at most this much of a file is read to check its encoding up front
_ESCAPED = re.compile("[\udc80-\udcff]")  # bytes surrogateescape kept because they did not decode

# The csv module's own limit raises mid-file and ends the iteration of the whole file; with no
# limit in the reader, a long cell is found per row (CSV_CELL_LIMIT) and that row alone fails.
# The setting is process-wide, but it only ever widens what csv accepts.
csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


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
    """csv, jsonl or parquet, by the suffix; a Parquet file without pyarrow is a MissingExtra, before any row."""
    try:
        kind = FORMATS[path.suffix.lower()]
    except KeyError:
        raise InputError(f"{path}: unsupported file type {path.suffix!r}; use .csv, .jsonl or .parquet") from None
    if kind == "parquet":
        require("parquet", f"{path.name} (Parquet)")
    return kind


OUTPUT_MARKS = (".checkpoint.json", ".lock", ".parts")  # beside a file gradekit writes (see _checkpoint, _lock, RowWriter)


# An ATIF trajectory is one JSON document per file (Harbor writes <trial>/agent/trajectory.json): a
# file of its own, or a folder of them, is read as one row per file.
ATIF_SUFFIX = ".json"
_ATIF_HEAD = 1 << 16  # how much of a .json file is read to tell an ATIF trajectory from other JSON


def input_format(path: Path) -> str:
    """The format an input file is read as: a row file's (:func:`file_format`), or ``atif`` for a .json file."""
    return "atif" if path.suffix.lower() == ATIF_SUFFIX else file_format(path)


def looks_atif(path: Path) -> bool:
    """Whether a .json file is an ATIF trajectory: named trajectory.json, or its head declares ``schema_version`` ATIF-v..."""
    if path.name == "trajectory.json":
        return True  # read even when broken, so its error is said by name rather than the file passed over
    try:
        with path.open("rb") as handle:
            head = handle.read(_ATIF_HEAD)
    except OSError:
        return False
    return re.search(rb'"schema_version"\s*:\s*"ATIF-', head) is not None


def input_files(source: Path) -> list[Path]:
    """The files an INPUT names: itself, or every CSV/JSONL/Parquet file of a folder, in sorted path order.

    See :func:`_walk` for the folder rules; past a run's door its :class:`RunInput` answers (``files``).
    """
    return _walk(source)


def _walk(source: Path, outputs: list[Path] | None = None, ignored: list[Path] | None = None) -> list[Path]:
    """The files an INPUT names (see :func:`input_files`).

    A folder is read recursively, as Ray Data reads one. Names starting with ``.`` or ``_`` are
    skipped at every level (hidden files, ``_SUCCESS``, ``_metadata``: Ray Data's and Spark's
    rule), so are files of other types (a README) and gradekit's own outputs (a file with a
    ``.checkpoint.json``, ``.lock`` or ``.parts`` beside it, and what is inside ``.parts``), so an
    OUTPUT written into the folder is never read back as input. A folder with no such file but
    ATIF trajectories (.json files, :func:`looks_atif`) is read one row per trajectory; its other
    .json files (a Harbor trial's config.json, result.json) go to ``ignored``, said by the run. Order is by relative path,
    compared part by part, so ``b/x.jsonl`` follows ``a.jsonl``. A folder holds one format:
    mixing CSV, JSONL and Parquet is an InputError, as is a folder with no such file.
    """
    if not source.is_dir():
        input_format(source)
        if not source.exists():
            raise InputError(f"{source}: no such file or folder")
        return [source]
    found: list[Path] = []
    others: list[str] = []
    documents: list[Path] = []
    for folder, dirs, names in os.walk(source):
        here = Path(folder)
        # A Parquet output's part files (<output>.parquet.parts/) are never input.
        dirs[:] = [d for d in dirs if not d.startswith((".", "_")) and not (d.endswith(".parts") and Path(d[:-6]).suffix.lower() in FORMATS)]
        for name in names:
            file = here / name
            if name.startswith((".", "_")) or not file.is_file():
                continue
            if _is_output(file):
                if outputs is not None and file.suffix.lower() in FORMATS:
                    outputs.append(file)  # said by the run (RunInput.skipped), never skipped silently
                continue
            if file.suffix.lower() in FORMATS:
                found.append(file)
            elif name.endswith(ATIF_SUFFIX) and not name.endswith(OUTPUT_MARKS):
                documents.append(file)
            elif not name.endswith((".tmp", ".json")):
                others.append(name)
    if not found and documents:  # no row file: the folder's ATIF trajectories, one row each
        found = [f for f in documents if looks_atif(f)]
        if ignored is not None:
            ignored.extend(sorted(set(documents) - set(found), key=lambda f: f.relative_to(source).parts))
    if not found:
        ignored = f" (ignored: {', '.join(sorted(others)[:5])}{', ...' if len(others) > 5 else ''})" if others else ""
        raise InputError(f"{source}: the folder holds no .csv, .jsonl or .parquet file{ignored}; names starting with . or _ are "
                         "skipped; nor an ATIF trajectory (.json)")
    found.sort(key=lambda f: f.relative_to(source).parts)
    kinds = Counter(input_format(f) for f in found)
    if len(kinds) > 1:
        mixed = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
        raise InputError(f"{source}: a folder input is one format, this one holds {mixed} files; put each format in its own folder")
    return found


def _is_output(file: Path) -> bool:
    """A file some gradekit run writes or wrote: its checkpoint, lock or Parquet parts are beside it."""
    if any(file.with_name(file.name + mark).exists() for mark in OUTPUT_MARKS):
        return True
    stem, dot, rest = file.name.rpartition(".retrying.")  # a --retry-errors copy: <stem>.retrying<suffix>
    return bool(dot) and file.with_name(f"{stem}.{rest}.lock").exists()



@dataclass(frozen=True, eq=False)
class RunInput:
    """A run's input (a file or a folder): resolved once at the run's door, the only input type past it.

    The folder is walked once (``files``); what each step asks of the input afterwards (its
    rows, columns, fingerprint, Parquet schema, row counts) is asked of this object, worked out
    on first need and kept, so the lock, the checkpoint, the column check and the reader all see
    the same files and no step walks the folder or reads a header again. Build it with
    :meth:`resolve`; a str() of it is the path, so messages read as before.
    """

    source: Path
    files: tuple[Path, ...]
    format: str  # csv, jsonl or parquet: every file's
    encoding: str | None = None  # --encoding for CSV/JSONL, None for UTF-8
    skipped: tuple[Path, ...] = ()  # a folder's data files left out as earlier gradekit outputs (a checkpoint beside them, ...)
    ignored: tuple[Path, ...] = ()  # a folder of ATIF trajectories: its .json files that are not one (said by the run)
    _counts: dict[Path, int] = field(default_factory=dict, repr=False)  # rows per file, once counted

    @classmethod
    def resolve(cls, source: Path | RunInput, encoding: str | None = None) -> RunInput:
        """The input ``source`` names (an InputError when it cannot be one); a RunInput is returned as it is."""
        if isinstance(source, RunInput):
            return source
        outputs: list[Path] = []
        ignored: list[Path] = []
        files = tuple(_walk(source, outputs, ignored))
        return cls(source, files, input_format(files[0]), encoding, tuple(sorted(outputs)), tuple(ignored))

    def __str__(self) -> str:
        return str(self.source)

    def __fspath__(self) -> str:
        return os.fspath(self.source)

    @property
    def is_folder(self) -> bool:
        return len(self.files) != 1 or self.files[0] != self.source

    def read(self, skip: int = 0) -> Iterator[dict[str, Any] | RowError]:
        """Yield each data row as a dict, or a RowError for a row that cannot be parsed.

        The files are read as one stream. ``skip`` passes over rows a resumed run has already
        written, without parsing them where the format allows (JSONL lines, Parquet row groups,
        whole files of a folder whose rows are counted). A row with bytes that do not decode, a
        CSV cell over ``CSV_CELL_LIMIT``, JSON nested past the parser's depth or a damaged Parquet
        page is that row's RowError, never the end of the file.
        """
        if not self.is_folder:
            yield from _file_rows(self.source, skip, self.encoding)
            return
        for file in self.files:
            if skip:
                rows = self.rows_in(file)
                if rows <= skip:
                    skip -= rows  # a whole file already written: not parsed again (JSONL, Parquet) or only counted (CSV)
                    continue
            yield from _file_rows(file, skip, self.encoding)
            skip = 0

    @cached_property
    def columns(self) -> list[str] | None:
        """The columns every row has, when the format says so up front (CSV header, Parquet schema).

        Asked before any request, it also stops a file that cannot be a good input: one whose
        first rows are not in its encoding, or whose columns repeat a name. Every file of a folder
        is checked, and a CSV or Parquet folder's files must have the same columns (Parquet: of the
        same types), since the output has one set of columns; a JSONL folder's rows may differ as
        a JSONL file's may.
        """
        return _columns(self.files, self.encoding, self._schema)

    @cached_property
    def fingerprint(self) -> dict[str, Any]:
        """Enough to tell that the input is the one a checkpoint was written for.

        A folder's covers every file it is read from (relative path, size, mtime): a file added,
        removed or changed since the checkpoint makes a resumed run start over, as for one file.
        """
        if self.is_folder:
            files = [[f.relative_to(self.source).as_posix(), (st := f.stat()).st_size, st.st_mtime_ns] for f in self.files]
            return {"path": str(self.source.resolve()), "files": files}
        stat = self.source.stat()
        return {"path": str(self.source.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}

    @cached_property
    def schema(self) -> Any:
        """A Parquet input's schema; a folder's is its first file's (``columns`` holds the others to it)."""
        return _file_schema(self.files[0])

    def _schema(self, file: Path) -> Any:
        return self.schema if file == self.files[0] else _file_schema(file)

    @property
    def rows(self) -> int | None:
        """The row count when it is known without reading the rows (Parquet metadata, or counted before)."""
        if all(f in self._counts for f in self.files) or self.format == "parquet":
            return self.count_rows()
        return None

    def rows_in(self, file: Path) -> int:
        """Rows one of the files holds (counted once: a pass over CSV/JSONL, Parquet metadata)."""
        if file not in self._counts:
            self._counts[file] = _count_file(file, self.encoding)
        return self._counts[file]

    def count_rows(self) -> int:
        """Rows a run will produce, for the progress bar (CSV cells may span lines, so parse)."""
        return sum(self.rows_in(file) for file in self.files)


class RowError(ValueError):
    """One input row is unusable; it still gets an output row, with this as its error."""


def codec(encoding: str | None) -> str:
    """The codec a CSV/JSONL file is read with: UTF-8 unless ``--encoding`` names another.

    UTF-8 is read as ``utf-8-sig`` so a byte order mark (Excel writes one) is not part of the first
    column's name.
    """
    name = encoding or "utf-8"
    try:
        found = codecs.lookup(name).name
    except LookupError:
        raise InputError(f"unknown encoding {name!r} (`encoding` takes a Python codec name: utf-8, latin-1, cp1252, gbk, ...)") from None
    return "utf-8-sig" if found == "utf-8" else found


@functools.lru_cache(maxsize=None)
def wide(name: str) -> bool:
    """Whether a codec does not write a newline as the byte 0x0a (UTF-16, UTF-32): its lines are found after decoding."""
    encoder = codecs.getincrementalencoder(name)()
    encoder.encode("a")  # past a byte order mark the codec writes first (utf-8-sig, utf-16, utf-32)
    return encoder.encode("\n") != b"\n"


def _utf8_lines(handle: IO[bytes], name: str) -> Iterator[bytes]:
    """A UTF-16/32 file's lines, decoded first (a 0x0a byte is half a character there) and given as UTF-8 bytes.

    A byte sequence that does not decode stays as those bytes (surrogateescape), so it is its row's
    error on the UTF-8 path, as in any other encoding.
    """
    text = io.TextIOWrapper(handle, encoding=name, errors="surrogateescape", newline="")
    for line in text:
        yield line.encode("utf-8", "surrogateescape")
    text.detach()


def read_rows(path: Path, skip: int = 0, encoding: str | None = None) -> Iterator[dict[str, Any] | RowError]:
    """The rows of a file or folder (see :meth:`RunInput.read`), for a caller that holds a path, not a run."""
    yield from RunInput.resolve(path, encoding).read(skip)


def _file_rows(path: Path, skip: int, encoding: str | None) -> Iterator[dict[str, Any] | RowError]:
    kind = input_format(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    if kind == "atif":
        if not skip:
            yield _atif_row(path)
        return
    with path.open("rb") as handle:
        yield from rows_of(handle, str(path), kind, skip, encoding)


def rows_of(handle: IO[bytes], label: str, kind: str, skip: int = 0, encoding: str | None = None) -> Iterator[dict[str, Any] | RowError]:
    """The rows of one open file (``label`` names it in errors): the one parser for local and Ray Data reads.

    ``handle`` is binary; Parquet needs it seekable. Ray Data's read tasks call this on the
    files they open (graders/runs/_ray_input.py), so a row reads the same on either path.
    """
    if kind == "parquet":
        yield from _parquet_rows(handle, label, skip)
    elif kind == "csv":
        yield from _csv_rows(handle, label, skip, codec(encoding))
    else:
        yield from _jsonl_rows(handle, label, skip, codec(encoding))


def _csv_rows(raw: IO[bytes], path: str, skip: int, name: str) -> Iterator[dict[str, Any] | RowError]:
    # surrogateescape: a stray byte that does not decode becomes that row's error, not the file's.
    # utf-8 (not utf-8-sig, which decodes slower) with the BOM taken off the first name by hand.
    with io.TextIOWrapper(raw, encoding="utf-8" if name == "utf-8-sig" else name, errors="surrogateescape", newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            return
        if header:
            header[0] = header[0].removeprefix("\ufeff")
        width = len(header)
        number = 0
        for cells in reader:
            if not cells:
                continue  # a blank line is no row (as csv.DictReader has it)
            number += 1
            if number <= skip:
                continue
            if len(cells) > width:
                yield RowError(f"{path} row {number}: {len(cells) - width} more cell(s) than the header has columns")
                continue
            whole = "".join(cells)  # one length check and one search for a clean row, the common case
            if len(whole) > CSV_CELL_LIMIT or _ESCAPED.search(whole) is not None:
                problem = _bad_cell(header, cells, name)
                if problem is not None:
                    yield RowError(f"{path} row {number}: {problem}")
                    continue
            row: dict[str, Any] = dict(zip(header, cells))
            if len(cells) < width:
                row.update(dict.fromkeys(header[len(cells):]))  # missing cells are None, as csv.DictReader has them
            yield row


def _bad_cell(header: list[str], cells: list[str], name: str) -> str | None:
    for column, value in zip(header, cells):
        if len(value) > CSV_CELL_LIMIT:
            return (f"column {column!r} holds a cell of {len(value):,} characters, over the CSV limit of {CSV_CELL_LIMIT:,}; "
                    "use JSONL or Parquet for cells this long")
        if (bad := _ESCAPED.search(value)) is not None:
            return (f"column {column!r} holds byte 0x{ord(bad.group()) - 0xDC00:02x}, which is not valid {_display(name)} "
                    "(name the file's encoding with `encoding`)")
    return None


def _display(name: str) -> str:
    return "UTF-8" if name == "utf-8-sig" else name


def _jsonl_rows(handle: IO[bytes], path: str, skip: int, name: str) -> Iterator[dict[str, Any] | RowError]:
    number = 0
    offset = 0
    lines: Iterator[bytes] | IO[bytes] = handle
    if wide(name):  # decoded first, then read as UTF-8 (byte offsets in messages are then the UTF-8 text's)
        lines, name = _utf8_lines(handle, name), "utf-8-sig"
    utf8 = name == "utf-8-sig"
    for raw in lines:
        start, offset = offset, offset + len(raw)
        if start == 0 and utf8 and raw.startswith(codecs.BOM_UTF8):
            raw, start = raw[len(codecs.BOM_UTF8):], len(codecs.BOM_UTF8)
        if not raw.strip():
            continue
        number += 1
        if number <= skip:
            continue
        if utf8:  # the fast path: orjson reads UTF-8 bytes itself; anything it refuses takes the path below
            try:
                value = orjson.loads(raw)
            except orjson.JSONDecodeError:
                pass
            else:
                if isinstance(value, dict):
                    # Inline, the cheap half of _repeated_key: a flat row has one '":' per key.
                    if raw.count(b'":') == len(value) or (repeated := _repeated_key(raw)) is None:
                        yield value
                    else:
                        yield RowError(f"{path} row {number}: the key {repeated!r} appears more than once in the object; "
                                       "a JSON key names one value (a CSV or Parquet file refuses repeated columns too)")
                    continue
        try:
            line = raw.decode(name)
        except UnicodeDecodeError as e:
            yield RowError(f"{path} row {number}: byte {start + e.start} (0x{raw[e.start]:02x}) is not valid {_display(name)} "
                           "(name the file's encoding with `encoding`)")
            continue
        try:
            value = _loads(line)
        except json.JSONDecodeError as e:
            yield RowError(f"{path} row {number}: not valid JSON ({e.msg} at column {e.colno})")
            continue
        except RecursionError:
            yield RowError(f"{path} row {number}: JSON nested deeper than the parser's limit ({sys.getrecursionlimit()} levels)")
            continue
        if not isinstance(value, dict):
            yield RowError(f"{path} row {number}: a JSONL row must be an object, got {type(value).__name__}")
        elif (lone := _lone_surrogate(line, value)) is not None:
            yield RowError(f"{path} row {number}: {lone!r} is half of a UTF-16 surrogate pair on its own, not text "
                           "(no output could hold it)")
        elif line.count('":') != len(value) and (repeated := _repeated_key(line)) is not None:
            yield RowError(f"{path} row {number}: the key {repeated!r} appears more than once in the object; "
                           "a JSON key names one value (a CSV or Parquet file refuses repeated columns too)")
        else:
            yield value


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _lone_surrogate(line: str, value: Any) -> str | None:
    """The first lone surrogate ("\\ud800", valid JSON) in a parsed row, or None: a pair is one character, a half no text."""
    if _SURROGATE_ESCAPE.search(line) is None:
        return None
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        return e.object[e.start]
    return None


def _repeated_key(data: bytes | str) -> str | None:
    """A key that appears twice in one object of the row (the parsers keep the last value silently), or None.

    Called only when the cheap test does not add up: each key of a flat row written by a JSON
    encoder is followed by ``":``, so a row with as many ``":`` as keys has no repeated key and
    is not parsed again. A row where the count differs (nested objects, a ``":`` inside a string,
    keys spaced from their colon) is parsed again with the standard library's pairs hook. Missed:
    only a row whose spaced and unspaced keys make the count come out even by chance.
    """
    repeated: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen and not repeated:
                repeated.append(key)
            seen.add(key)
        return dict(items)

    try:
        json.loads(data, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None  # orjson read it; whatever json refuses here (a huge number) is no repeated key
    return repeated[0] if repeated else None


def _parquet_rows(source: IO[bytes], path: str, skip: int) -> Iterator[dict[str, Any] | RowError]:
    """Row group by row group: a damaged page fails the rest of its group's rows, and the next group reads on."""
    import pyarrow.parquet as pq

    try:
        handle = pq.ParquetFile(source)
    except Exception as e:  # pyarrow raises several types for a damaged file
        raise InputError(f"{path}: not a readable Parquet file ({e})") from e
    with handle:
        start = 0  # rows before this row group
        for group in range(handle.num_row_groups):
            size = handle.metadata.row_group(group).num_rows
            if start + size <= skip:
                start += size  # a whole row group already written: not even read
                continue
            done = start  # rows of the file yielded or skipped so far
            try:
                for batch in handle.iter_batches(batch_size=PARQUET_BATCH, row_groups=[group]):
                    rows = batch.to_pylist()
                    first = done
                    done += len(rows)
                    yield from rows[max(0, skip - first):]
            except Exception as e:  # ArrowInvalid, OSError, ...: a corrupt page or a bad decompression
                cause = str(e).splitlines()[0] if str(e) else type(e).__name__
                for number in range(max(done, skip) + 1, start + size + 1):
                    yield RowError(f"{path} row {number}: unreadable Parquet data in row group {group} ({cause})")
            start += size



def _columns(files: tuple[Path, ...], encoding: str | None, schema: Any) -> list[str] | None:
    found = [(file, _file_columns(file, encoding, schema)) for file in files]
    # An empty CSV or JSONL file (a shard with no rows) has no header to compare: it adds no row.
    known = [(file, columns) for file, columns in found if columns is not None and (columns or file.stat().st_size)]
    if not known:
        return found[0][1]
    base, first = known[0]
    for file, columns in known[1:]:
        if set(columns) != set(first):
            missing, extra = [c for c in first if c not in columns], [c for c in columns if c not in first]
            raise InputError(f"{file}: its columns differ from {base}'s"
                             + (f"; it lacks {', '.join(map(repr, missing))}" if missing else "")
                             + (f"; it adds {', '.join(map(repr, extra))}" if extra else "")
                             + "; every file of a CSV or Parquet folder has the same columns")
    if len(known) > 1 and file_format(base) == "parquet":
        first_schema = schema(base)
        for file, _ in known[1:]:
            other = schema(file)
            for column in first_schema:
                if other.field(column.name).type != column.type:
                    raise InputError(f"{file}: column {column.name!r} is {other.field(column.name).type} where {base} "
                                     f"has {column.type}; every file of a Parquet folder has the same column types")
    return first


def _atif_row(path: Path) -> dict[str, Any] | RowError:
    """One ATIF file as a row: ``id`` (its path), ``session_id`` and ``trajectory`` (the document; checked when graded)."""
    try:
        document = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        return RowError(f"{path}: not a readable JSON document ({e})")
    if not isinstance(document, dict):
        return RowError(f"{path}: an ATIF trajectory is a JSON object, this file holds {type(document).__name__}")
    return {"id": str(path), "session_id": document.get("session_id"), "trajectory": document}


def _file_columns(path: Path, encoding: str | None, schema: Any = None) -> list[str] | None:
    kind = input_format(path)
    if kind == "atif":
        return None
    if kind == "parquet":
        columns = list((schema or _file_schema)(path).names)
    else:
        check_encoding(path, encoding)
        if kind == "jsonl":
            return None
        with path.open(encoding=codec(encoding), errors="surrogateescape", newline="") as handle:
            columns = next(csv.reader(handle), [])
        if columns:
            columns[0] = columns[0].removeprefix("\ufeff")  # a byte order mark the codec keeps (utf-16-le, ...)
    repeated = [name for name, n in Counter(columns).items() if n > 1]
    if repeated:
        raise InputError(f"{path}: duplicate column names {', '.join(map(repr, repeated))}; give each column its own name")
    return columns


def check_encoding(path: Path, encoding: str | None = None) -> None:
    """Stop before any request when the header or first rows of a CSV/JSONL file do not decode.

    Such a file is in another encoding (an Excel export in Latin-1, say), and every row would
    fail; a bad byte further on is only that row's error (see :meth:`RunInput.read`).
    """
    name = codec(encoding)
    offset = 0
    with path.open("rb") as handle:
        if wide(name):  # no line is a run of bytes ending in 0x0a here: decode the first bytes as one piece
            data = handle.read(_PROBE_BYTES)
            try:
                codecs.getincrementaldecoder(name)().decode(data, final=len(data) < _PROBE_BYTES)
            except UnicodeDecodeError as e:
                raise InputError(f"{path}: byte {e.start} is not valid {name}, so the file is in another encoding; "
                                 "name it with `encoding`") from None
            return
        for count, raw in enumerate(handle):
            try:
                raw.decode(name)
            except UnicodeDecodeError as e:
                raise InputError(
                    f"{path}: byte {offset + e.start} (0x{raw[e.start]:02x}) is not valid {_display(name)}, so the file is in "
                    "another encoding; name it with `encoding`, e.g. `encoding` latin-1 or `encoding` cp1252 for an Excel export"
                ) from None
            offset += len(raw)
            if count >= FIRST_ROWS or offset >= _PROBE_BYTES:
                return



def _file_schema(path: Path) -> Any:
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(path)
    except Exception as e:
        raise InputError(f"{path}: not a readable Parquet file ({e})") from e



def _count_file(path: Path, encoding: str | None) -> int:
    if input_format(path) == "atif":
        return 1
    if file_format(path) == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    if file_format(path) == "jsonl":
        with path.open("rb") as handle:
            name = codec(encoding)
            return sum(1 for line in (_utf8_lines(handle, name) if wide(name) else handle) if line.strip())
    return sum(1 for _ in _file_rows(path, 0, encoding))


def written_rows(path: Path) -> Iterator[dict[str, Any]]:
    """Every row of a finished output file."""
    for row in _file_rows(path, 0, None):
        if isinstance(row, dict):
            yield row



TAIL_BYTES = 4096


def tail_hash(path: Path, offset: int) -> str:
    """A hash of the last bytes before ``offset``: the end of the last row a checkpoint claims."""
    import hashlib

    with path.open("rb") as handle:
        handle.seek(max(0, offset - TAIL_BYTES))
        return hashlib.sha256(handle.read(min(offset, TAIL_BYTES))).hexdigest()


def text_rows_before(path: Path, offset: int) -> int:
    """How many rows the first ``offset`` bytes of a CSV/JSONL output hold (CSV cells may span lines, so parse)."""

    def lines() -> Iterator[bytes]:
        left = offset
        with path.open("rb") as handle:
            for raw in handle:
                if left <= 0:
                    return
                yield raw[:left]
                left -= len(raw)

    if file_format(path) == "jsonl":
        return sum(1 for raw in lines() if raw.strip())
    records = sum(1 for _ in csv.reader(raw.decode("utf-8", "surrogateescape") for raw in lines()))
    return max(0, records - 1)  # the header


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
        offset = self._handle.tell()
        return {"rows": self.rows, "offset": offset, "tail": tail_hash(self.path, offset)}

    def mark_after_close(self) -> dict[str, Any]:
        """Where a finished output ends (its size and tail let a later run see it was not cut short or edited)."""
        if self.kind == "parquet":
            return {"rows": self.rows}
        offset = self.path.stat().st_size
        return {"rows": self.rows, "offset": offset, "tail": tail_hash(self.path, offset)}

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
            if self.kind == "csv" and self._csv is None and complete and self._columns and not self.rows:
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

